"""Which batches are ready to finalize, and claiming one under the batch lease.

The condition (`ready`) is `steps.finalization`'s list of endings; leases and expiry are
judged by the database's clock. The claim reads what finalizing needs (shards, chunk keys,
how the batch ends) in the transaction that takes the lease and moves the project's clock.
"""

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, and_, exists, or_, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import BatchLease
from app.core.states import BatchStatus, BatchStep, Ending, ShardStatus
from app.db.clock import db_now
from app.db.models import Batch, File, ResultChunk, Shard
from app.db.session import session_scope
from app.services import lease as leases
from app.services.steps import batch_lease, step_share

DEFAULT_OUTPUT_EXPIRES_AFTER = 30 * 24 * 3600
# Ready batches a claim looks at: enough that racing finalizers skip to another one.
_CANDIDATES_PER_CLAIM = 8


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


def claim_next(settings: Settings, owner: str, seen: set[str]) -> Finalization | None:
    """Claims the first ready batch not yet `seen`, in order; every one tried joins `seen`."""
    for batch_id, epoch in candidates(settings, seen):
        seen.add(batch_id)
        job = claim(settings, batch_id, epoch, owner)
        if job is not None:
            return job
    return None


def ready(settings: Settings) -> ColumnElement[bool]:
    """SQL condition: the batch is ready to finalize (`steps.finalization`'s docstring)."""
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


def claimable(settings: Settings) -> ColumnElement[bool]:
    """SQL condition: ready, nobody finalizing it, and no backoff to wait out."""
    return and_(ready(settings), batch_lease.lease_is_free(settings), batch_lease.step_due())


def candidates(settings: Settings, seen: Collection[str] = ()) -> list[tuple[str, int]]:
    """Ready batches nobody is finalizing, but those `seen`, in the order they are taken."""
    # Batches whose finalization never failed first: failing ones wait out their backoff and
    # then come behind them.
    waiting = (
        select(Batch.id, Batch.lease_epoch)
        .where(claimable(settings), Batch.id.not_in(seen))
        .order_by(Batch.step_failures)
    )
    with session_scope(settings) as session:
        rows = session.execute(
            step_share.in_order(waiting, BatchStep.FINALIZATION, settings.scheduler).limit(
                _CANDIDATES_PER_CLAIM
            )
        ).all()
    return [(row[0], row[1]) for row in rows]


def claim(settings: Settings, batch_id: str, epoch: int, owner: str) -> Finalization | None:
    with session_scope(settings) as session:
        # Checked again as the lease is taken: another finalizer may have ended the batch
        # since it was chosen, keeping the epoch (a lapsed holder that woke up and recorded).
        lease = batch_lease.take(session, batch_id, epoch, owner, claimable(settings))
        if lease is None:
            return None
        waiting = ready(settings)
        step_share.charge(session, BatchStep.FINALIZATION, batch_id, waiting, settings.scheduler)
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
