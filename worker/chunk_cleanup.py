"""Removing result chunks once their batch is terminal: objects first, then their rows.

The finalizer removes a batch's chunks when it ends; housekeeping sweeps those of a finalizer
that died before it could.
"""

from sqlalchemy import ColumnElement, delete, exists, select

from app.config import Settings
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
