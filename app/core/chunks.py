"""Result chunks: immutable JSONL objects of finished lines, written under a shard lease.

Each line is `{"line": <physical input line number>, "output": <the exact output or error
file line>}`. Chunks are named by `(batch, shard, epoch, sequence)`, so a new lease holder
never overwrites an old one's.
"""

from collections.abc import Iterable, Iterator
from typing import Any

import orjson


def chunk_key(batch_id: str, shard_index: int, epoch: int, sequence: int) -> str:
    return f"batches/{batch_id}/shards/{shard_index:06d}/{epoch:06d}-{sequence:06d}.jsonl"


def encode_line(line: int, output: dict[str, Any]) -> bytes:
    return orjson.dumps({"line": line, "output": output})


def encode_chunk(lines: Iterable[bytes]) -> bytes:
    """The object's bytes, from lines made by `encode_line`."""
    return b"".join(line + b"\n" for line in lines)


def decode_chunk(data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    """`(line number, output line)` of each result in a chunk object's bytes."""
    for raw in data.splitlines():
        if raw.strip():
            record = orjson.loads(raw)
            yield int(record["line"]), record["output"]
