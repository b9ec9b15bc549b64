"""Finalisation: turn a batch's result chunks into its output and error files.

Called by the API's housekeeping loop and by workers. A batch is ready when

- `in_progress` and every shard is `done` → `finalizing` → `completed`;
- `cancelling` and no shard is held by a live worker → `cancelled`;
- `in_progress` (or still `validating`) past `expires_at`, no live shard lease → `expired`;
- `finalizing` but its finaliser stopped renewing the batch lease → picked up again.

The finaliser merges each shard's chunks (first result per line wins), reads the
shard's input range, and streams one line per request, in input order, into the
output file (2xx) or the error file (everything else, plus `batch_cancelled` /
`batch_expired` lines for requests that never ran). One fenced transaction then
records both files, counts, usage and the final status.
"""

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import ColumnElement, and_, delete, exists, func, or_, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.db.models import TERMINAL_BATCH_STATUSES, Batch, File, ResultChunk, Shard
from app.db.session import session_scope
from app.ids import new_batch_request_id, new_file_id
from app.services import batch_lease
from app.services.batch_lease import Heartbeat, Lease
from app.services.batches import Progress
from app.services.files import create_file_from_storage, file_storage_key
from app.services.jsonl import iter_lines
from app.services.monitoring import throughput_series
from app.storage import Storage, StoredObject, Writer, storage_of
from app.usage import usage_of

log = logging.getLogger("overnight.finalizer")

DEFAULT_OUTPUT_EXPIRES_AFTER = 30 * 24 * 3600
_CANDIDATES_PER_PASS = 50
_HEARTBEAT_CHECK_LINES = 256
_CHUNKS_PER_DELETE = 5000

# Why a request has no result, by finalisation path.
_UNRUN = {
    "cancel": ("batch_cancelled", "This request was cancelled before it could be executed."),
    "expire": (
        "batch_expired",
        "This request could not be executed before the completion window expired.",
    ),
    "complete": ("batch_failed", "This request was not executed because of an internal error."),
}


def _add_usage(tally: Progress, body: Any) -> None:
    usage = usage_of(body)
    tally.input_tokens += usage.input_tokens
    tally.output_tokens += usage.output_tokens
    tally.cached_tokens += usage.cached_tokens
    tally.reasoning_tokens += usage.reasoning_tokens


@dataclass
class Job:
    """A claimed batch and what finalising it needs."""

    lease: Lease
    path: str  # "complete", "cancel" or "expire"
    input_key: str
    output_expires_after: int
    shards: list[Shard] = field(default_factory=list)
    chunks: dict[int, list[str]] = field(default_factory=dict)  # shard id → chunk keys, in order
    chunk_count: int = 0


def finalize_ready_batches(settings: Settings, owner: str, storage: Storage | None = None) -> int:
    """Finalises every batch that is ready and not being finalised; returns how many ended."""
    storage = storage or storage_of(settings)
    finished = 0
    for batch_id, epoch in _candidates(settings):
        job = _claim(settings, batch_id, epoch, owner)
        if job is None:
            continue
        try:
            if finalize(settings, storage, job):
                finished += 1
        except Exception:
            log.exception("finalising %s failed; it will be retried", batch_id)
            batch_lease.release(settings, job.lease)
    return finished


def _candidates(settings: Settings) -> list[tuple[str, int]]:
    now = time.time()
    live_shard = exists().where(
        Shard.batch_id == Batch.id,
        Shard.status == "running",
        Shard.heartbeat_at >= now - settings.lease_seconds,
    )
    open_shard = exists().where(Shard.batch_id == Batch.id, Shard.status != "done")
    expired = Batch.expires_at <= int(now)
    ready = or_(
        and_(Batch.status == "in_progress", ~open_shard),
        and_(Batch.status == "in_progress", expired, ~live_shard),
        and_(Batch.status == "cancelling", ~live_shard),
        and_(Batch.status == "validating", expired),
        Batch.status == "finalizing",
    )
    with session_scope(settings) as session:
        rows = session.execute(
            select(Batch.id, Batch.lease_epoch)
            .where(ready, batch_lease.lease_is_free(settings, now))
            .order_by(Batch.seq)
            .limit(_CANDIDATES_PER_PASS)
        ).all()
    return [(row[0], row[1]) for row in rows]


def _claim(settings: Settings, batch_id: str, epoch: int, owner: str) -> Job | None:
    with session_scope(settings) as session:
        lease = batch_lease.take(session, batch_id, epoch, owner)
        if lease is None:
            return None
        batch = session.scalar(
            select(Batch).where(Batch.id == batch_id).execution_options(populate_existing=True)
        )
        assert batch is not None
        shards = list(
            session.scalars(select(Shard).where(Shard.batch_id == batch_id).order_by(Shard.index))
        )
        path = _path(batch, shards)
        if path == "complete" and batch.status == "in_progress":
            batch.status = "finalizing"
            batch.finalizing_at = int(time.time())
        input_key = session.scalar(select(File.storage_key).where(File.id == batch.input_file_id))
        job = Job(
            lease=lease,
            path=path,
            input_key=input_key or "",
            output_expires_after=batch.output_expires_after or DEFAULT_OUTPUT_EXPIRES_AFTER,
            shards=shards,
        )
        _load_chunks(session, job)
        return job


def _path(batch: Batch, shards: list[Shard]) -> str:
    if batch.status == "cancelling":
        return "cancel"
    if batch.status == "finalizing":
        return "complete"
    if batch.status == "in_progress" and all(s.status == "done" for s in shards):
        return "complete"
    return "expire"


def _load_chunks(session: Session, job: Job) -> None:
    rows = session.execute(
        select(ResultChunk.shard_id, ResultChunk.storage_key)
        .join(Shard, Shard.id == ResultChunk.shard_id)
        .where(Shard.batch_id == job.lease.batch_id)
        .order_by(ResultChunk.shard_id, ResultChunk.epoch, ResultChunk.sequence)
    ).all()
    for shard_id, key in rows:
        job.chunks.setdefault(shard_id, []).append(key)
    job.chunk_count = len(rows)


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


def finalize(settings: Settings, storage: Storage, job: Job) -> bool:
    """Writes the files and records them; False if the lease was lost or results changed."""
    output, errors = _LazyFile(storage, "output"), _LazyFile(storage, "error")
    tally = Progress()
    try:
        for line in _merged_lines(storage, job, Heartbeat(settings, job.lease)):
            response = line.get("response")
            status = response.get("status_code") if isinstance(response, dict) else None
            if isinstance(status, int) and 200 <= status < 300:
                output.write(orjson.dumps(line) + b"\n")
                tally.completed += 1
                _add_usage(tally, response.get("body") if isinstance(response, dict) else None)
            else:
                errors.write(orjson.dumps(line) + b"\n")
                tally.failed += 1
        written = [(side, side.commit()) for side in (output, errors)]
    except _LeaseLost:
        output.abort()
        errors.abort()
        return False
    except BaseException:
        output.abort()
        errors.abort()
        raise
    if not _record(settings, job, written, tally):
        for _side, obj in written:
            if obj is not None:
                storage.delete(obj.key)
        batch_lease.release(settings, job.lease)
        return False
    delete_chunks(settings, storage, job.lease.batch_id)
    return True


class _LeaseLost(Exception):
    pass


def _merged_lines(storage: Storage, job: Job, heartbeat: Heartbeat) -> Iterator[dict[str, Any]]:
    """Every request's output line, in input order; a made-up error line for unrun requests."""
    code, message = _UNRUN[job.path]
    count = 0
    for shard in job.shards:
        results = _shard_results(storage, job.chunks.get(shard.id, []))
        for line_no, raw in iter_lines(
            storage, job.input_key, shard.byte_start, shard.byte_end, shard.first_line
        ):
            count += 1
            if count % _HEARTBEAT_CHECK_LINES == 0 and not heartbeat.beat():
                raise _LeaseLost(job.lease.batch_id)
            result = results.pop(line_no, None)
            yield result if result is not None else _unrun_line(raw, code, message)


def _shard_results(storage: Storage, chunk_keys: list[str]) -> dict[int, dict[str, Any]]:
    results: dict[int, dict[str, Any]] = {}
    for key in chunk_keys:
        for _line_no, raw in iter_lines(storage, key):
            record = orjson.loads(raw)
            results.setdefault(record["line"], record["output"])
    return results


def _unrun_line(raw: bytes, code: str, message: str) -> dict[str, Any]:
    request = orjson.loads(raw)
    return {
        "id": new_batch_request_id(),
        "custom_id": request["custom_id"],
        "response": None,
        "error": {"code": code, "message": message},
    }


def _record(
    settings: Settings,
    job: Job,
    written: list[tuple[_LazyFile, StoredObject | None]],
    tally: Progress,
) -> bool:
    """The one transaction that ends the batch, fenced by the batch lease."""
    batch_id = job.lease.batch_id
    with session_scope(settings) as session:
        batch = session.scalar(
            select(Batch)
            .where(Batch.id == batch_id, Batch.lease_epoch == job.lease.epoch)
            .with_for_update()
            .execution_options(populate_existing=True)
        )
        if batch is None:
            return False
        # Refuse late writes of any shard holder, then check nothing arrived since we read.
        session.execute(
            update(Shard)
            .where(Shard.batch_id == batch_id, Shard.status != "done")
            .values(lease_epoch=Shard.lease_epoch + 1, lease_owner=None)
            .execution_options(synchronize_session=False)
        )
        chunk_count = session.scalar(
            select(func.count(ResultChunk.id))
            .join(Shard, Shard.id == ResultChunk.shard_id)
            .where(Shard.batch_id == batch_id)
        )
        if chunk_count != job.chunk_count:
            session.rollback()
            return False
        now = int(time.time())
        files = {
            side.side: create_file_from_storage(
                session,
                project_id=batch.project_id,
                filename=f"{batch_id}_{side.side}.jsonl",
                purpose="batch_output",
                stored=obj,
                expires_at=now + job.output_expires_after,
                file_id=side.file_id,
                created_at=now,
            )
            for side, obj in written
            if obj is not None
        }
        _finish(batch, job.path, files, tally, now)
        batch.throughput = throughput_series(session, batch_id)
    return True


def _finish(batch: Batch, path: str, files: dict[str, File], tally: Progress, now: int) -> None:
    if path == "expire":
        batch.status, batch.expired_at = "expired", now
    elif batch.status == "cancelling":
        batch.status, batch.cancelled_at = "cancelled", now
    else:
        batch.status, batch.completed_at = "completed", now
    batch.output_file_id = files["output"].id if "output" in files else None
    batch.error_file_id = files["error"].id if "error" in files else None
    batch.completed, batch.failed = tally.completed, tally.failed
    batch.input_tokens, batch.cached_tokens = tally.input_tokens, tally.cached_tokens
    batch.output_tokens, batch.reasoning_tokens = tally.output_tokens, tally.reasoning_tokens
    batch.lease_owner, batch.heartbeat_at = None, None


def delete_chunks(settings: Settings, storage: Storage, batch_id: str) -> int:
    """Removes a finished batch's result chunks: objects first, then their rows."""
    total = 0
    while deleted := _delete_chunks(settings, storage, Shard.batch_id == batch_id):
        total += deleted
    return total


def delete_leftover_chunks(settings: Settings, storage: Storage) -> int:
    """Removes chunks of terminal batches that a finaliser died before deleting."""
    terminal = exists().where(Batch.id == Shard.batch_id, Batch.status.in_(TERMINAL_BATCH_STATUSES))
    return _delete_chunks(settings, storage, terminal)


def _delete_chunks(settings: Settings, storage: Storage, which: ColumnElement[bool]) -> int:
    with session_scope(settings) as session:
        rows = session.execute(
            select(ResultChunk.id, ResultChunk.storage_key)
            .join(Shard, Shard.id == ResultChunk.shard_id)
            .where(which)
            .limit(_CHUNKS_PER_DELETE)
        ).all()
    for _id, key in rows:
        storage.delete(key)
    if rows:
        with session_scope(settings) as session:
            session.execute(delete(ResultChunk).where(ResultChunk.id.in_([r[0] for r in rows])))
    return len(rows)
