"""Reading a leased shard: its input lines (streamed) and the lines it already finished."""

from collections.abc import Iterator

import orjson

from app.core.chunks import decode_chunk
from app.core.leases import ShardLease
from app.services.jsonl import iter_lines
from app.storage import Storage


def finished_lines(storage: Storage, chunk_keys: list[str]) -> set[int]:
    """Line numbers that already have a recorded result in these chunks."""
    return {
        line for key in chunk_keys for line, _output in decode_chunk(b"".join(storage.read(key)))
    }


Request = tuple[int, str, str, dict[str, object]]


def read_requests(storage: Storage, lease: ShardLease, skip: set[int]) -> Iterator[Request]:
    """`(line number, custom_id, url, body)` of each request of the shard not in `skip`.

    The validator already checked every line, so they parse. The url is the line's own: the
    service's validator made it the batch's endpoint, `run-batch` lets each line choose.
    """
    for line, raw in iter_lines(
        storage, lease.input_key, lease.byte_start, lease.byte_end, lease.first_line
    ):
        if line in skip:
            continue
        request = orjson.loads(raw)
        body = request.get("body")
        url = str(request.get("url", lease.endpoint))
        yield line, str(request["custom_id"]), url, body if isinstance(body, dict) else {}


def take(lines: Iterator[Request], n: int) -> list[Request]:
    """The next `n` requests (fewer at the end); run it in a thread, storage reads block."""
    out = []
    for item in lines:
        out.append(item)
        if len(out) >= n:
            break
    return out
