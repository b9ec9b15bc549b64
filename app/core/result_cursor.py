"""The opaque cursor of a batch's results read so far (`GET /v1/batches/{id}/results`).

While the batch runs, its results are its recorded chunks: the cursor holds, per shard, the
last chunk read, `(epoch, sequence)`, and how many of its lines were taken. A shard's chunks
commit in `(epoch, sequence)` order (each record updates the shard's row under its lease), so
a chunk that commits later always sorts after the position: nothing is skipped or reread.
Once the batch has ended, its results are its files: the cursor holds the file (output, then
error) and a byte offset in it.
"""

import base64
import zlib
from dataclasses import dataclass, field
from enum import IntEnum

import orjson


class ResultFile(IntEnum):
    """An ended batch's result files, in the order they are read."""

    OUTPUT = 0
    ERROR = 1


@dataclass(frozen=True)
class ChunkPosition:
    """The chunk `(epoch, sequence)` of a shard read last, and how many of its lines."""

    epoch: int
    sequence: int
    taken: int


@dataclass
class ChunkCursor:
    """Positions in a running batch's chunks, by shard index; a shard absent is unread."""

    shards: dict[int, ChunkPosition] = field(default_factory=dict)


@dataclass(frozen=True)
class FileCursor:
    """A position in an ended batch's result files."""

    file: ResultFile = ResultFile.OUTPUT
    offset: int = 0


Cursor = ChunkCursor | FileCursor


class BadCursor(ValueError):
    pass


def encode(cursor: Cursor) -> str:
    if isinstance(cursor, FileCursor):
        state: dict[str, list[int]] = {"f": [int(cursor.file), cursor.offset]}
    else:
        state = {
            "c": [
                n
                for index, at in sorted(cursor.shards.items())
                for n in (index, at.epoch, at.sequence, at.taken)
            ]
        }
    return base64.urlsafe_b64encode(zlib.compress(orjson.dumps(state))).decode().rstrip("=")


def decode(token: str | None) -> Cursor:
    """The cursor a token names; none is the start of a running batch's chunks."""
    if not token:
        return ChunkCursor()
    try:
        raw = zlib.decompress(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        state = orjson.loads(raw)
        if "f" in state:
            file, offset = state["f"]
            return FileCursor(ResultFile(int(file)), _natural(offset))
        flat = [_natural(n) for n in state["c"]]
        if len(flat) % 4:
            raise BadCursor(token)
        return ChunkCursor(
            {flat[i]: ChunkPosition(*flat[i + 1 : i + 4]) for i in range(0, len(flat), 4)}
        )
    except (zlib.error, KeyError, TypeError, ValueError) as exc:  # ValueError: bad base64, JSON
        raise BadCursor(token) from exc


def _natural(value: object) -> int:
    if not isinstance(value, int) or value < 0:
        raise BadCursor(str(value))
    return value
