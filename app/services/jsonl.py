"""Streaming JSONL reader shared by the validator, the worker and the finalizer.

Each of them must agree on what a "line" is, so there is exactly one reader:
lines are split on `\\n`, numbered physically (1-based, blank lines count), and
blank or whitespace-only lines are skipped because they are not requests.
"""

from collections.abc import Iterable, Iterator

from app.storage import Storage

_BOM = b"\xef\xbb\xbf"


def scan_lines(
    chunks: Iterable[bytes], start: int = 0, first_line: int = 1
) -> Iterator[tuple[int, int, bytes]]:
    """Yields `(line number, byte offset of the line, line bytes)` for each non-blank line.

    `start` is the byte offset of the first chunk in the object. A UTF-8 byte
    order mark at offset 0 is dropped from the line but still counted in offsets.
    """
    pending: list[bytes] = []  # pieces of a line that spans chunks; joined once, never re-copied
    offset = start
    line_no = first_line
    for chunk in chunks:
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            if nl < 0:
                if pos < len(chunk):
                    pending.append(chunk[pos:])
                break
            line = chunk[pos:nl]
            if pending:
                pending.append(line)
                line = b"".join(pending)
                pending.clear()
            if line and not line.isspace():
                yield line_no, offset, _without_bom(line, offset)
            offset += len(line) + 1
            line_no += 1
            pos = nl + 1
    if pending:
        line = b"".join(pending)
        if not line.isspace():
            yield line_no, offset, _without_bom(line, offset)


def _without_bom(line: bytes, offset: int) -> bytes:
    return line[3:] if offset == 0 and line.startswith(_BOM) else line


def iter_lines(
    storage: Storage, key: str, start: int = 0, end: int | None = None, first_line: int = 1
) -> Iterator[tuple[int, bytes]]:
    """Streams `[start, end)` of a stored JSONL object as `(physical line number, line bytes)`.

    `first_line` is the physical number of the line starting at `start`. The
    newline is not included; a last line without a newline is still a line.
    """
    for line_no, _offset, line in scan_lines(storage.read(key, start, end), start, first_line):
        yield line_no, line
