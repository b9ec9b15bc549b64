"""A batch's output and error files, assembled from its result chunks while the lease holds.

Each shard's chunks are merged (first result per line wins) and its input range read, so
one line per request streams, in input order, into the output file (2xx) or the error file
(everything else, plus the ending's `batch_cancelled` / `batch_expired` line for a request
that never ran). Nothing of either file is kept if the assembly stops.
"""

from collections.abc import Iterator
from typing import Any

import orjson

from app.config import Settings
from app.core.progress import Progress
from app.core.states import Ending
from app.ids import new_batch_request_id, new_file_id
from app.services.files import file_storage_key
from app.services.steps.batch_lease import Heartbeat
from app.services.steps.finalization_claim import Finalization
from app.services.steps.lost_objects import input_lines
from app.services.steps.recorded import Recorded, read_recorded, result_of
from app.storage import Storage, StoredObject, Writer

_HEARTBEAT_CHECK_LINES = 256

# Why a request has no result, by how the batch ends.
UNRUN = {
    Ending.CANCEL: ("batch_cancelled", "This request was cancelled before it could be executed."),
    Ending.EXPIRE: (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    Ending.COMPLETE: (
        "batch_failed",
        "This request was not executed because of an internal error.",
    ),
}


class _LazyFile:
    """An output File's object, opened on its first line: an empty side leaves no file at all."""

    def __init__(self, storage: Storage, side: str) -> None:
        self.storage = storage
        self.side = side
        self.file_id = new_file_id()
        self.writer: Writer | None = None

    def write(self, data: bytes) -> None:
        if self.writer is None:
            self.writer = self.storage.writer(file_storage_key(self.file_id))
        self.writer.write(data)

    def commit(self) -> StoredObject | None:
        return self.writer.commit() if self.writer is not None else None

    def abort(self) -> None:
        if self.writer is not None:
            self.writer.abort()


Written = list[tuple[_LazyFile, StoredObject | None]]


class LeaseLost(Exception):
    pass


class ChunksLost(Exception):
    """A shard's recorded chunks are not all in the store any more."""

    def __init__(self, shard_id: int, recorded: Recorded) -> None:
        super().__init__(shard_id, recorded.missing)
        self.shard_id = shard_id
        self.recorded = recorded


def write_files(
    settings: Settings, storage: Storage, job: Finalization
) -> tuple[Written, Progress, int]:
    """Streams the output and error files; nothing of them is kept if it raises."""
    output, errors = _LazyFile(storage, "output"), _LazyFile(storage, "error")
    tally, unrun = Progress(), 0
    unrun_code, _message = UNRUN[job.path]
    try:
        for line in _merged_lines(storage, job, Heartbeat(settings, job.lease)):
            ok, usage = result_of(line)
            (output if ok else errors).write(orjson.dumps(line) + b"\n")
            tally.add(ok, usage)
            if not ok and (line.get("error") or {}).get("code") == unrun_code:
                unrun += 1
        return [(side, side.commit()) for side in (output, errors)], tally, unrun
    except BaseException:
        output.abort()
        errors.abort()
        raise


def _merged_lines(
    storage: Storage, job: Finalization, heartbeat: Heartbeat
) -> Iterator[dict[str, Any]]:
    """Every request's output line, in input order; a made-up error line for unrun requests."""
    code, message = UNRUN[job.path]
    count = 0
    for shard in job.shards:
        recorded = read_recorded(storage, job.chunks.get(shard.id, []), keep=True)
        if recorded.missing:
            raise ChunksLost(shard.id, recorded)
        results = recorded.results
        for line_no, raw in input_lines(
            storage, job.input_key, shard.byte_start, shard.byte_end, shard.first_line
        ):
            count += 1
            if count % _HEARTBEAT_CHECK_LINES == 0 and not heartbeat.beat():
                raise LeaseLost(job.lease.batch_id)
            result = results.pop(line_no, None)
            yield result if result is not None else _unrun_line(raw, code, message)


def _unrun_line(raw: bytes, code: str, message: str) -> dict[str, Any]:
    request = orjson.loads(raw)
    return {
        "id": new_batch_request_id(),
        "custom_id": request["custom_id"],
        "response": None,
        "error": {"code": code, "message": message},
    }
