"""Resuming: the leases a previous run of this command held are stale by definition."""

from sqlalchemy import update

from app.config import Settings
from app.core.states import ShardStatus
from app.db.models import Batch, Shard
from app.db.session import session_scope


def take_over(settings: Settings, batch_id: str) -> None:
    """Expires them now, so this run claims at once instead of waiting out the lease."""
    with session_scope(settings) as session:
        session.execute(
            update(Shard)
            .where(Shard.batch_id == batch_id, Shard.status == ShardStatus.RUNNING)
            .values(heartbeat_at=0.0)
        )
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id, Batch.lease_owner.is_not(None))
            .values(heartbeat_at=0.0)
        )
