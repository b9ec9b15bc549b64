"""Reading a leased shard's input lines, streamed (what it finished: `steps.recorded`)."""

from collections.abc import Iterator

import orjson

from app.core.leases import ShardLease
from app.services.steps.lost_objects import input_lines
from app.storage import Storage

Request = tuple[int, str, str, dict[str, object]]


def read_requests(storage: Storage, lease: ShardLease, skip: set[int]) -> Iterator[Request]:
    """`(line number, custom_id, url, body)` of each request of the shard not in `skip`.

    The validator already checked every line, so they parse. The url is the line's own: the
    service's validator made it the batch's endpoint, `run-batch` lets each line choose.
    `MissingInput` if the store lost the input file.
    """
    for line, raw in input_lines(
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
