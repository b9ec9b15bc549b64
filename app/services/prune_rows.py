"""Rows no API shows any more, removed some time after they ended, a bounded number a call.

What stays: every Batch (OpenAI keeps the Batch object) and every File a batch or an upload
names (their ids are in it; a deleted or expired one stays hidden). What goes, each after its
own age:

- an ended batch's shards (the caller first removes any result chunks left, objects
  first). Its counts, usage and throughput live on the batch row from
  its end on, so `/metrics`, the API and the dashboard's totals do not change; a worker's
  page lists fewer recent shards.
- webhook deliveries delivered or failed (the endpoint's delivery list shows fewer);
- workers not seen for the age (never sooner than the names they served are remembered);
- deleted or expired files' rows once their bytes are gone and nothing names them;
- ended uploads (completed, cancelled, expired) with their parts (the caller removes the
  parts' objects first).

Every age is judged by the database's clock (`older_than`), like every lease.
"""

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, delete, func, select, union
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import SQLCoreOperations
from sqlalchemy.sql.selectable import CompoundSelect

from app.core.states import TERMINAL_BATCH_STATUSES, DeliveryStatus
from app.db.clock import db_now
from app.db.models import (
    Batch,
    File,
    RegisteredWorker,
    Shard,
    ShardAdapter,
    Upload,
    UploadPart,
    WebhookDelivery,
)
from app.schemas.uploads import UploadStatus

ENDED_UPLOAD_STATUSES = (UploadStatus.COMPLETED, UploadStatus.CANCELLED, UploadStatus.EXPIRED)
ENDED_DELIVERY_STATUSES = (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED)


def older_than(stamp: SQLCoreOperations[Any], seconds: float) -> ColumnElement[bool]:
    """SQL condition: the Unix time `stamp` is more than `seconds` behind the database's now."""
    return stamp < db_now() - seconds


def _batch_ended_at() -> ColumnElement[Any]:
    return func.coalesce(Batch.completed_at, Batch.failed_at, Batch.cancelled_at, Batch.expired_at)


def _ended_long_ago(seconds: float) -> ColumnElement[bool]:
    return Batch.status.in_(TERMINAL_BATCH_STATUSES) & older_than(_batch_ended_at(), seconds)


def ended_batches_with_rows(session: Session, seconds: float, limit: int) -> list[str]:
    """Batches that ended more than `seconds` ago and still have shards: those of the first
    `limit` such shards (in batch order, so a batch counts its shards once)."""
    with_shards = (
        select(Shard.batch_id)
        .join(Batch, Batch.id == Shard.batch_id)
        .where(_ended_long_ago(seconds))
        .order_by(Shard.batch_id, Shard.index)
        .limit(limit)
    )
    return sorted(set(session.scalars(with_shards)))


def delete_batch_rows(session: Session, batch_ids: Sequence[str]) -> int:
    """Removes the shards of ended batches, with their adapters (the caller removed their
    chunks)."""
    shards = select(Shard.id).where(Shard.batch_id.in_(batch_ids))
    session.execute(delete(ShardAdapter).where(ShardAdapter.shard_id.in_(shards)))
    return _count(session.execute(delete(Shard).where(Shard.batch_id.in_(batch_ids))))


def prune_deliveries(session: Session, seconds: float, limit: int) -> int:
    """Removes deliveries that were delivered or failed more than `seconds` ago."""
    ended_at = func.coalesce(
        WebhookDelivery.delivered_at, WebhookDelivery.last_attempt_at, WebhookDelivery.created_at
    )
    old = (
        select(WebhookDelivery.seq)
        .where(WebhookDelivery.status.in_(ENDED_DELIVERY_STATUSES), older_than(ended_at, seconds))
        .limit(limit)
    )
    return _delete_in(session, WebhookDelivery, WebhookDelivery.seq, list(session.scalars(old)))


def prune_workers(session: Session, seconds: float, limit: int) -> int:
    """Removes the rows of workers whose last heartbeat is more than `seconds` old."""
    old = (
        select(RegisteredWorker.id)
        .where(older_than(RegisteredWorker.heartbeat_at, seconds))
        .limit(limit)
    )
    return _delete_in(session, RegisteredWorker, RegisteredWorker.id, list(session.scalars(old)))


def prune_files(session: Session, seconds: float, limit: int) -> int:
    """Removes the rows of files deleted (or expired) more than `seconds` ago whose bytes
    are reclaimed and that no batch or upload names."""
    named: CompoundSelect[Any] = union(
        select(Batch.input_file_id),
        select(Batch.output_file_id).where(Batch.output_file_id.is_not(None)),
        select(Batch.error_file_id).where(Batch.error_file_id.is_not(None)),
        select(Upload.file_id).where(Upload.file_id.is_not(None)),
    )
    old = (
        select(File.seq)
        .where(
            File.deleted_at.is_not(None),
            File.storage_key == "",
            older_than(File.deleted_at, seconds),
            File.id.not_in(named),
        )
        .limit(limit)
    )
    return _delete_in(session, File, File.seq, list(session.scalars(old)))


def ended_uploads(session: Session, seconds: float, limit: int) -> dict[str, list[str]]:
    """Uploads that ended and expired more than `seconds` ago, with their parts' keys."""
    ids = session.scalars(
        select(Upload.id)
        .where(Upload.status.in_(ENDED_UPLOAD_STATUSES), older_than(Upload.expires_at, seconds))
        .order_by(Upload.seq)
        .limit(limit)
    ).all()
    parts: dict[str, list[str]] = {upload_id: [] for upload_id in ids}
    rows = session.execute(
        select(UploadPart.upload_id, UploadPart.storage_key).where(UploadPart.upload_id.in_(ids))
    )
    for upload_id, key in rows:
        parts[upload_id].append(key)
    return parts


def delete_upload_rows(session: Session, upload_ids: Sequence[str]) -> int:
    """Removes ended uploads' rows and their parts' (whose objects went first)."""
    session.execute(delete(UploadPart).where(UploadPart.upload_id.in_(upload_ids)))
    return _delete_in(session, Upload, Upload.id, upload_ids)


def _delete_in(session: Session, table: type[Any], column: Any, values: Sequence[Any]) -> int:
    if not values:
        return 0
    return _count(session.execute(delete(table).where(column.in_(values))))


def _count(result: Any) -> int:
    return int(getattr(result, "rowcount", 0) or 0)
