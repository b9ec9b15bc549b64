"""Finalization, the pipeline's last stage: a batch's result chunks become its output files.

Workers run it when their shards end; the API's housekeeping loop runs it too, for batches
no worker will touch again (cancelled or expired with no live shard). A batch is ready when

- `in_progress` and every shard is `done` → `finalizing` → `completed`;
- `cancelling` and no shard is held by a live worker → `cancelled`, unless every shard is
  `done`: every request has its result then, so the cancel came too late and it completes;
- `in_progress` (or still `validating`) past `expires_at`, no live shard lease → `expired`;
- `finalizing` but its finalizer stopped renewing the batch lease → picked up again.

The finalizer claims a ready batch (`steps.finalization_claim`), writes its output and
error files from the shards' chunks (`steps.output_files`), and then one fenced transaction
records both files, counts, usage and the final status.

A chunk whose object is gone has its row dropped and a done shard goes back to run its lines
again; an input file that is gone fails the batch (`steps.lost_objects`). A finalization that
raises backs off, per batch (`batch_lease.fail`), and batches that never failed go
first: no number of failing batches delays the others.
"""

import logging
import time

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import BatchLease
from app.core.progress import Progress
from app.core.states import BatchStatus, Ending, ShardStatus
from app.db.models import Batch, File, ResultChunk, Shard
from app.db.session import session_scope
from app.schemas.files import FileObjectPurpose
from app.services.files import create_file_from_storage
from app.services.result_series import throughput_series
from app.services.steps import batch_lease
from app.services.steps.batch_end import end_batch
from app.services.steps.chunk_cleanup import delete_chunks
from app.services.steps.finalization_claim import Finalization, claim_next
from app.services.steps.lost_objects import MissingInput, fail_batch, forget_chunks, reopen
from app.services.steps.output_files import ChunksLost, LeaseLost, Written, write_files
from app.storage import Storage, storage_of

log = logging.getLogger("overnight.finalizer")

_CANDIDATES_PER_PASS = 50


def finalize_ready_batches(settings: Settings, owner: str, storage: Storage | None = None) -> int:
    """Finalizes every batch that is ready and not being finalized; returns how many ended.

    The next batch is chosen again after each one, fair share across projects (`step_share`);
    a pass tries each batch once, and `_CANDIDATES_PER_PASS` at most.
    """
    storage = storage or storage_of(settings)
    finished = 0
    seen: set[str] = set()
    while len(seen) < _CANDIDATES_PER_PASS and (job := claim_next(settings, owner, seen)):
        try:
            if finalize(settings, storage, job):
                finished += 1
        except Exception:
            batch_id = job.lease.batch_id
            log.exception("finalizing %s failed; it will be retried after a backoff", batch_id)
            batch_lease.fail(settings, job.lease)
    return finished


def finalize(settings: Settings, storage: Storage, job: Finalization) -> bool:
    """Writes the files and records them; whether the batch ended (False if the lease was
    lost, results changed, or a lost chunk sent its lines back to run)."""
    try:
        written, tally, unrun = write_files(settings, storage, job)
    except LeaseLost:
        return False
    except ChunksLost as lost:
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


def _forget(settings: Settings, job: Finalization, lost: ChunksLost) -> None:
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


def _record(
    settings: Settings,
    job: Finalization,
    written: Written,
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
