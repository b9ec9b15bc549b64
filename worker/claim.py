"""Shard leases: claim, checkpoint (results + counts + heartbeat, fenced), release.

A claim is one conditional `UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING`; on PostgreSQL
the inner select takes `FOR UPDATE SKIP LOCKED` so concurrent workers never wait on each
other, on SQLite every transaction is already `BEGIN IMMEDIATE`. A claim bumps the shard's
`lease_epoch`; every later write names that epoch and is refused once someone else holds a
newer one (fencing).
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from app.db.models import Batch, File, ResultChunk, Shard
from app.services.batches import Progress

RUNNABLE_BATCH_STATUS = "in_progress"


@dataclass(frozen=True)
class Lease:
    """A shard this worker holds, with what it needs to run it."""

    shard_id: int
    batch_id: str
    index: int
    first_line: int
    line_count: int
    byte_start: int
    byte_end: int
    epoch: int
    owner: str
    endpoint: str
    input_key: str

    def chunk_key(self, sequence: int) -> str:
        return (
            f"batches/{self.batch_id}/shards/{self.index:06d}/{self.epoch:06d}-{sequence:06d}.jsonl"
        )


@dataclass(frozen=True)
class BatchState:
    status: str
    expires_at: int

    def should_stop(self, now: float) -> str | None:
        """Why a holder must let go of the batch's shards now, if it must."""
        if self.status == "cancelling":
            return "cancelled"
        if self.status != RUNNABLE_BATCH_STATUS:
            return self.status
        if now >= self.expires_at:
            return "expired"
        return None


def claim_shard(
    session: Session, owner: str, models: Sequence[str], lease_seconds: float
) -> Lease | None:
    """Take the oldest runnable shard: pending, or running under a lease that lapsed."""
    now = time.time()
    candidate = (
        select(Shard.id)
        .join(Batch, Batch.id == Shard.batch_id)
        .where(
            Batch.status == RUNNABLE_BATCH_STATUS,
            Batch.model.in_(list(models)),
            Batch.expires_at > int(now),
            or_(
                Shard.status == "pending",
                and_(Shard.status == "running", Shard.heartbeat_at < now - lease_seconds),
            ),
        )
        .order_by(Batch.seq, Shard.index)
        .limit(1)
        .with_for_update(skip_locked=True, of=Shard)
        .scalar_subquery()
    )
    claimed = session.execute(
        update(Shard)
        .where(Shard.id == candidate)
        .values(
            status="running",
            lease_owner=owner,
            lease_epoch=Shard.lease_epoch + 1,
            heartbeat_at=now,
            attempts=Shard.attempts + 1,
        )
        .returning(Shard.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if claimed is None:
        return None
    row = session.execute(
        select(Shard, Batch.endpoint, File.storage_key)
        .join(Batch, Batch.id == Shard.batch_id)
        .join(File, File.id == Batch.input_file_id)
        .where(Shard.id == claimed)
    ).one()
    shard: Shard = row[0]
    return Lease(
        shard_id=shard.id,
        batch_id=shard.batch_id,
        index=shard.index,
        first_line=shard.first_line,
        line_count=shard.line_count,
        byte_start=shard.byte_start,
        byte_end=shard.byte_end,
        epoch=shard.lease_epoch,
        owner=owner,
        endpoint=row[1],
        input_key=row[2],
    )


def recorded_chunk_keys(session: Session, shard_id: int) -> list[str]:
    """The shard's result chunks, in the order their results count (first wins)."""
    return list(
        session.scalars(
            select(ResultChunk.storage_key)
            .where(ResultChunk.shard_id == shard_id)
            .order_by(ResultChunk.epoch, ResultChunk.sequence)
        )
    )


def checkpoint(
    session: Session,
    lease: Lease,
    *,
    chunk: tuple[int, str, int] | None = None,
    progress: Progress | None = None,
    done: bool = False,
    release: bool = False,
) -> BatchState | None:
    """Record a chunk `(sequence, key, lines)` with its counts and renew the lease, atomically.

    `done` closes the shard, `release` hands it back as pending. Returns the batch's state,
    or None when the lease was lost (nothing was written then).
    """
    now = time.time()
    p = progress or Progress()
    status = "done" if done else "pending" if release else "running"
    renewed = session.execute(
        update(Shard)
        .where(
            Shard.id == lease.shard_id,
            Shard.lease_epoch == lease.epoch,
            Shard.lease_owner == lease.owner,
            Shard.status == "running",
        )
        .values(
            completed=Shard.completed + p.completed,
            failed=Shard.failed + p.failed,
            input_tokens=Shard.input_tokens + p.input_tokens,
            cached_tokens=Shard.cached_tokens + p.cached_tokens,
            output_tokens=Shard.output_tokens + p.output_tokens,
            reasoning_tokens=Shard.reasoning_tokens + p.reasoning_tokens,
            heartbeat_at=now,
            status=status,
            lease_owner=lease.owner if status == "running" else None,
        )
        .returning(Shard.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if renewed is None:
        return None
    if chunk is not None:
        sequence, key, lines = chunk
        session.add(
            ResultChunk(
                shard_id=lease.shard_id,
                epoch=lease.epoch,
                sequence=sequence,
                storage_key=key,
                lines=lines,
                created_at=now,
            )
        )
    status_row = session.execute(
        select(Batch.status, Batch.expires_at).where(Batch.id == lease.batch_id)
    ).one()
    return BatchState(status_row[0], status_row[1])
