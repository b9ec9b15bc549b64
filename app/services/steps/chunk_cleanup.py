"""Removing result chunks: once their batch is terminal (objects first, then their rows), or
one whose record failed, if no row names it.

The finalizer removes a batch's chunks when it ends; housekeeping sweeps those of a finalizer
that died before it could.
"""

from sqlalchemy import ColumnElement, delete, exists, select

from app.config import Settings
from app.core.leases import ShardLease
from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, ResultChunk, Shard
from app.db.session import session_scope
from app.storage import Storage

_CHUNKS_PER_DELETE = 5000


def delete_chunks(settings: Settings, storage: Storage, batch_id: str) -> int:
    """Removes a finished batch's result chunks: objects first, then their rows."""
    total = 0
    while deleted := _delete_chunks(settings, storage, Shard.batch_id == batch_id):
        total += deleted
    return total


def delete_leftover_chunks(settings: Settings, storage: Storage) -> int:
    """Removes chunks of terminal batches that a finalizer died before deleting."""
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


def delete_unrecorded(
    settings: Settings, storage: Storage, lease: ShardLease, sequence: int
) -> bool:
    """Deletes the holder's chunk `sequence` unless a row names it; True if it was deleted.

    Asked in a transaction of its own: a record refused or failed may have committed all the
    same (its reply was lost), and a recorded chunk must never lose its object. Once the lease
    has moved on, no earlier transaction of this holder can still commit: each one updates
    the shard's row, which the new claim waited for.
    """
    key = lease.chunk_key(sequence)
    named = exists().where(
        ResultChunk.shard_id == lease.shard_id,
        ResultChunk.epoch == lease.epoch,
        ResultChunk.sequence == sequence,
        ResultChunk.storage_key == key,
    )
    with session_scope(settings) as session:
        if session.scalar(select(named)):
            return False
    storage.delete(key)
    return True
