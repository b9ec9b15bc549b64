"""Finalization, the pipeline's last stage: a batch's result chunks become its output files.

Workers run it when their shards end; the API's housekeeping loop runs it too, for batches
no worker will touch again (cancelled or expired with no live shard). A batch is ready when

- `in_progress` and every shard is `done` → `finalizing` → `completed`;
- `cancelling` and no shard is held by a live worker → `cancelled`, unless every shard is
  `done`: every request has its result then, so the cancel came too late and it completes;
- `in_progress` (or still `validating`) past `expires_at`, no live shard lease → `expired`;
- `finalizing` but its finalizer stopped renewing the batch lease → picked up again.

The finalizer merges each shard's chunks (first result per line wins), reads the
shard's input range, and streams one line per request, in input order, into the
output file (2xx) or the error file (everything else, plus `batch_cancelled` /
`batch_expired` lines for requests that never ran). One fenced transaction then
records both files, counts, usage and the final status.

A chunk whose object is gone has its row dropped and a done shard goes back to run its lines
again; an input file that is gone fails the batch (`worker.lost_objects`). A finalization
that raises backs off, per batch (`batch_lease.fail`), and batches that never failed go
first: no number of failing batches delays the others.
"""

import logging
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from sqlalchemy import ColumnElement, and_, exists, func, or_, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import BatchLease
from app.core.progress import Progress
from app.core.states import BatchStatus, BatchStep, Ending, ShardStatus
from app.db.clock import db_now
from app.db.models import Batch, File, ResultChunk, Shard
from app.db.session import session_scope
from app.ids import new_batch_request_id, new_file_id
from app.schemas.files import FileObjectPurpose
from app.services import batch_lease, step_share
from app.services import lease as leases
from app.services.batch_end import end_batch
from app.services.batch_lease import Heartbeat
from app.services.files import create_file_from_storage, file_storage_key
from app.services.result_series import throughput_series
from app.storage import Storage, StoredObject, Writer, storage_of
from worker.chunk_cleanup import delete_chunks
from worker.lost_objects import MissingInput, fail_batch, forget_chunks, input_lines, reopen
from worker.recorded import Recorded, read_recorded, result_of

log = logging.getLogger("overnight.finalizer")

DEFAULT_OUTPUT_EXPIRES_AFTER = 30 * 24 * 3600
_CANDIDATES_PER_PASS = 50
# Ready batches a claim looks at: enough that racing finalizers skip to another one.
_CANDIDATES_PER_CLAIM = 8
_HEARTBEAT_CHECK_LINES = 256

# Why a request has no result, by how the batch ends.
_UNRUN = {
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


@dataclass
class Finalization:
    """A claimed batch and what finalizing it needs."""

    lease: BatchLease
    path: Ending  # how the batch ends
    input_key: str
    output_expires_after: int
    shards: list[Shard] = field(default_factory=list)
    chunks: dict[int, list[str]] = field(default_factory=dict)  # shard id → chunk keys, in order
    chunk_count: int = 0


def finalize_ready_batches(settings: Settings, owner: str, storage: Storage | None = None) -> int:
    """Finalizes every batch that is ready and not being finalized; returns how many ended.

    The next batch is chosen again after each one, fair share across projects (`step_share`);
    a pass tries each batch once, and `_CANDIDATES_PER_PASS` at most.
    """
    storage = storage or storage_of(settings)
    finished = 0
    seen: set[str] = set()
    while len(seen) < _CANDIDATES_PER_PASS and (job := _claim_next(settings, owner, seen)):
        try:
            if finalize(settings, storage, job):
                finished += 1
        except Exception:
            batch_id = job.lease.batch_id
            log.exception("finalizing %s failed; it will be retried after a backoff", batch_id)
            batch_lease.fail(settings, job.lease)
    return finished


def _claim_next(settings: Settings, owner: str, seen: set[str]) -> Finalization | None:
    """Claims the first ready batch not yet `seen`, in order; every one tried joins `seen`."""
    for batch_id, epoch in _candidates(settings, seen):
        seen.add(batch_id)
        job = _claim(settings, batch_id, epoch, owner)
        if job is not None:
            return job
    return None


def _ready(settings: Settings) -> ColumnElement[bool]:
    """SQL condition: the batch is ready to finalize (this module's docstring); leases and
    expiry by the database's clock."""
    live_shard = exists().where(
        Shard.batch_id == Batch.id,
        Shard.status == ShardStatus.RUNNING,
        leases.live(Shard.heartbeat_at, settings.lease_seconds),
    )
    open_shard = exists().where(Shard.batch_id == Batch.id, Shard.status != ShardStatus.DONE)
    expired = Batch.expires_at <= db_now()
    return or_(
        and_(Batch.status == BatchStatus.IN_PROGRESS, ~open_shard),
        and_(Batch.status == BatchStatus.IN_PROGRESS, expired, ~live_shard),
        and_(Batch.status == BatchStatus.CANCELLING, ~live_shard),
        and_(Batch.status == BatchStatus.VALIDATING, expired),
        Batch.status == BatchStatus.FINALIZING,
    )


def _candidates(settings: Settings, seen: Collection[str] = ()) -> list[tuple[str, int]]:
    """Ready batches nobody is finalizing, but those `seen`, in the order they are taken."""
    # Batches whose finalization never failed first: failing ones wait out their backoff and
    # then come behind them.
    ready = (
        select(Batch.id, Batch.lease_epoch)
        .where(
            _ready(settings),
            batch_lease.lease_is_free(settings),
            batch_lease.step_due(),
            Batch.id.not_in(seen),
        )
        .order_by(Batch.step_failures)
    )
    with session_scope(settings) as session:
        rows = session.execute(
            step_share.in_order(ready, BatchStep.FINALIZATION, settings.scheduler).limit(
                _CANDIDATES_PER_CLAIM
            )
        ).all()
    return [(row[0], row[1]) for row in rows]


def _claim(settings: Settings, batch_id: str, epoch: int, owner: str) -> Finalization | None:
    with session_scope(settings) as session:
        lease = batch_lease.take(session, batch_id, epoch, owner)
        if lease is None:
            return None
        ready = _ready(settings)
        step_share.charge(session, BatchStep.FINALIZATION, batch_id, ready, settings.scheduler)
        batch = session.scalar(
            select(Batch).where(Batch.id == batch_id).execution_options(populate_existing=True)
        )
        assert batch is not None
        shards = list(
            session.scalars(select(Shard).where(Shard.batch_id == batch_id).order_by(Shard.index))
        )
        ending = _ending(batch, shards)
        if ending is Ending.COMPLETE and batch.status != BatchStatus.FINALIZING:
            batch.status = BatchStatus.FINALIZING
            batch.finalizing_at = int(time.time())
        input_key = session.scalar(select(File.storage_key).where(File.id == batch.input_file_id))
        job = Finalization(
            lease=lease,
            path=ending,
            input_key=input_key or "",
            output_expires_after=batch.output_expires_after or DEFAULT_OUTPUT_EXPIRES_AFTER,
            shards=shards,
        )
        _load_chunks(session, job)
        return job


def _ending(batch: Batch, shards: list[Shard]) -> Ending:
    """Complete once every shard is done (each line has its result), whatever else happened."""
    if batch.status == BatchStatus.FINALIZING or (
        shards and all(s.status == ShardStatus.DONE for s in shards)
    ):
        return Ending.COMPLETE
    if batch.status == BatchStatus.CANCELLING:
        return Ending.CANCEL
    return Ending.EXPIRE


def _load_chunks(session: Session, job: Finalization) -> None:
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


def finalize(settings: Settings, storage: Storage, job: Finalization) -> bool:
    """Writes the files and records them; whether the batch ended (False if the lease was
    lost, results changed, or a lost chunk sent its lines back to run)."""
    try:
        written, tally, unrun = _write_files(settings, storage, job)
    except _LeaseLost:
        return False
    except _ChunksLost as lost:
        _forget(settings, job, lost)
        return False
    except MissingInput as missing:
        if not _fail(settings, job, missing.key):
            return False
        delete_chunks(settings, storage, job.lease.batch_id)
        return True
    if not _record(settings, job, written, tally, unrun):
        for _side, obj in written:
            if obj is not None:
                storage.delete(obj.key)
        batch_lease.release(settings, job.lease)
        return False
    delete_chunks(settings, storage, job.lease.batch_id)
    return True


_Written = list[tuple[_LazyFile, StoredObject | None]]


def _write_files(
    settings: Settings, storage: Storage, job: Finalization
) -> tuple[_Written, Progress, int]:
    """Streams the output and error files; nothing of them is kept if it raises."""
    output, errors = _LazyFile(storage, "output"), _LazyFile(storage, "error")
    tally, unrun = Progress(), 0
    unrun_code, _message = _UNRUN[job.path]
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


class _LeaseLost(Exception):
    pass


class _ChunksLost(Exception):
    """A shard's recorded chunks are not all in the store any more."""

    def __init__(self, shard_id: int, recorded: Recorded) -> None:
        super().__init__(shard_id, recorded.missing)
        self.shard_id = shard_id
        self.recorded = recorded


def _forget(settings: Settings, job: Finalization, lost: _ChunksLost) -> None:
    """Drops the lost chunks' rows, fenced by the batch lease: their lines run again if the
    batch was completing, else they get the ending's error line at the next try."""
    with session_scope(settings) as session:
        batch = _locked_batch(session, job.lease)
        if batch is not None:
            forget_chunks(session, lost.shard_id, lost.recorded)
            if job.path is Ending.COMPLETE:
                reopen(session, batch, lost.shard_id)
    batch_lease.release(settings, job.lease)


def _fail(settings: Settings, job: Finalization, key: str) -> bool:
    """The input file is gone: the batch fails, naming it; False if the lease was lost."""
    with session_scope(settings) as session:
        batch = _locked_batch(session, job.lease)
        failed = batch is not None and fail_batch(session, batch, key)
        if failed:
            _fence_shards(session, job.lease.batch_id)
    if not failed:
        batch_lease.release(settings, job.lease)
    return failed


def _merged_lines(
    storage: Storage, job: Finalization, heartbeat: Heartbeat
) -> Iterator[dict[str, Any]]:
    """Every request's output line, in input order; a made-up error line for unrun requests."""
    code, message = _UNRUN[job.path]
    count = 0
    for shard in job.shards:
        recorded = read_recorded(storage, job.chunks.get(shard.id, []), keep=True)
        if recorded.missing:
            raise _ChunksLost(shard.id, recorded)
        results = recorded.results
        for line_no, raw in input_lines(
            storage, job.input_key, shard.byte_start, shard.byte_end, shard.first_line
        ):
            count += 1
            if count % _HEARTBEAT_CHECK_LINES == 0 and not heartbeat.beat():
                raise _LeaseLost(job.lease.batch_id)
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


def _record(
    settings: Settings,
    job: Finalization,
    written: list[tuple[_LazyFile, StoredObject | None]],
    tally: Progress,
    unrun: int,
) -> bool:
    """The one transaction that ends the batch, fenced by the batch lease."""
    batch_id = job.lease.batch_id
    with session_scope(settings) as session:
        batch = _locked_batch(session, job.lease)
        if batch is None:
            return False
        # Refuse late writes of any shard holder, then check nothing arrived since we read.
        _fence_shards(session, batch_id)
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
                purpose=FileObjectPurpose.BATCH_OUTPUT,
                stored=obj,
                expires_at=now + job.output_expires_after,
                file_id=side.file_id,
                created_at=now,
            )
            for side, obj in written
            if obj is not None
        }
        _finish(session, batch, job.path, files, tally, unrun, now)
        batch.throughput = throughput_series(session, batch_id)
    return True


def _locked_batch(session: Session, lease: BatchLease) -> Batch | None:
    """The batch's row, locked, while the lease is still ours (fencing)."""
    return session.scalar(
        select(Batch)
        .where(Batch.id == lease.batch_id, batch_lease.held(lease))
        .with_for_update()
        .execution_options(populate_existing=True)
    )


def _fence_shards(session: Session, batch_id: str) -> None:
    """Refuses every later write of the batch's shard holders."""
    session.execute(
        update(Shard)
        .where(Shard.batch_id == batch_id, Shard.status != ShardStatus.DONE)
        .values(lease_epoch=Shard.lease_epoch + 1, lease_owner=None)
        .execution_options(synchronize_session=False)
    )


# Decided when the finalization was claimed: a cancel arriving later cannot make a batch
# whose every request had its result (finalizing) `cancelled`.
_FINAL_STATUS = {
    Ending.COMPLETE: BatchStatus.COMPLETED,
    Ending.CANCEL: BatchStatus.CANCELLED,
    Ending.EXPIRE: BatchStatus.EXPIRED,
}


def _finish(
    session: Session,
    batch: Batch,
    ending: Ending,
    files: dict[str, File],
    tally: Progress,
    unrun: int,
    now: int,
) -> None:
    """`unrun`: the requests that never ran, with the ending's error code."""
    batch.output_file_id = files["output"].id if "output" in files else None
    batch.error_file_id = files["error"].id if "error" in files else None
    for name, value in tally.values().items():
        setattr(batch, name, value)
    status = _FINAL_STATUS[ending]
    batch.cancelled = unrun if status == BatchStatus.CANCELLED else 0
    batch.expired = unrun if status == BatchStatus.EXPIRED else 0
    end_batch(session, batch, status, now)
