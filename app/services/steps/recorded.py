"""A shard's recorded result chunks, read back from the store: the first result per line wins.

The worker reads them to resume a shard, the finalizer to merge it. A chunk whose object is
gone (deleted behind our back, or by a store's lifecycle rule) is reported, not raised: its
row is then dropped and its lines run again (`app.services.steps.lost_objects`).
"""

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from app.core.chunks import decode_chunk
from app.core.progress import Progress, Usage, usage_of
from app.storage import Storage


@dataclass
class Recorded:
    """What a shard's chunks hold, counting each line's first result only."""

    lines: set[int] = field(default_factory=set)
    progress: Progress = field(default_factory=Progress)
    results: dict[int, dict[str, Any]] = field(default_factory=dict)  # only when kept
    missing: list[str] = field(default_factory=list)  # keys whose object is gone


def read_recorded(storage: Storage, chunk_keys: Iterable[str], keep: bool = False) -> Recorded:
    """Reads the chunks; with `keep`, their output lines too (else only line numbers)."""
    recorded = Recorded()
    for key in chunk_keys:
        try:
            data = b"".join(storage.read(key))
        except FileNotFoundError:
            recorded.missing.append(key)
            continue
        for line, output in decode_chunk(data):
            if line in recorded.lines:
                continue
            recorded.lines.add(line)
            recorded.progress.add(*result_of(output))
            if keep:
                recorded.results[line] = output
    return recorded


def result_of(line: dict[str, Any]) -> tuple[bool, Usage]:
    """Whether an output line is a success (it goes to the output file), and its usage."""
    response = line.get("response")
    if not isinstance(response, dict):
        return False, Usage()
    status = response.get("status_code")
    ok = isinstance(status, int) and 200 <= status < 300
    return ok, usage_of(response.get("body")) if ok else Usage()
