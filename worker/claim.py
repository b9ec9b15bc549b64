"""Shard leases: claim, checkpoint (results + counts + heartbeat, fenced), release.

A claim is one conditional `UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING`; on PostgreSQL
the inner select takes `FOR UPDATE SKIP LOCKED` so concurrent workers never wait on each
other, on SQLite every transaction is already `BEGIN IMMEDIATE`. A claim bumps the shard's
`lease_epoch`; every later write names that epoch and is refused once someone else holds a
newer one (fencing).
"""

import time
from collections.abc import Sequence

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from app.core.leases import BatchState, ShardLease
from app.core.progress import PROGRESS_FIELDS, Progress
from app.core.states import BatchStatus, ShardStatus
from app.db.models import Batch, File, ResultChunk, Shard


def claim_shard(
    session: Session, owner: str, models: Sequence[str], lease_seconds: float
) -> ShardLease | None:
    """Take the oldest runnable shard: pending, or running under a lease that lapsed."""
    now = time.time()
    candidate = (
        select(Shard.id)
        .join(Batch, Batch.id == Shard.batch_id)
        .where(
            Batch.status == BatchStatus.IN_PROGRESS,
            Batch.model.in_(list(models)),
            Batch.expires_at > int(now),
            or_(
                Shard.status == ShardStatus.PENDING,
                and_(
                    Shard.status == ShardStatus.RUNNING,
                    Shard.heartbeat_at < now - lease_seconds,
                ),
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
            status=ShardStatus.RUNNING,
            lease_owner=owner,
            last_owner=owner,
            lease_epoch=Shard.lease_epoch + 1,
            heartbeat_at=now,
            attempts=Shard.attempts + 1,
        )
        .returning(Shard.id)
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    return None if claimed is None else _lease(session, claimed, owner)


def _lease(session: Session, shard_id: int, owner: str) -> ShardLease:
    row = session.execute(
        select(Shard, Batch.endpoint, File.storage_key)
        .join(Batch, Batch.id == Shard.batch_id)
        .join(File, File.id == Batch.input_file_id)
        .where(Shard.id == shard_id)
    ).one()
    shard: Shard = row[0]
    return ShardLease(
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
    lease: ShardLease,
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
    added = (progress or Progress()).values()
    status = ShardStatus.DONE if done else ShardStatus.PENDING if release else ShardStatus.RUNNING
    renewed = session.execute(
        update(Shard)
        .where(
            Shard.id == lease.shard_id,
            Shard.lease_epoch == lease.epoch,
            Shard.lease_owner == lease.owner,
            Shard.status == ShardStatus.RUNNING,
        )
        .values({name: getattr(Shard, name) + added[name] for name in PROGRESS_FIELDS})
        .values(
            heartbeat_at=now,
            status=status,
            lease_owner=lease.owner if status == ShardStatus.RUNNING else None,
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
