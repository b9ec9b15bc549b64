"""Deleting and expiring files: hidden from the API at once, bytes reclaimed after.

The bytes stay while a running batch still reads the file as its input.
"""

from collections.abc import Iterable, Sequence

from sqlalchemy import ColumnElement, exists, select
from sqlalchemy.orm import Session

from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, File
from app.schemas.files import FileDeleted
from app.services.files import get_file, now
from app.storage import Storage

# Rows handled per housekeeping call, so that one call stays a short transaction.
SWEEP_LIMIT = 1000


def _not_read_by_running_batch() -> ColumnElement[bool]:
    return ~exists().where(
        Batch.input_file_id == File.id, Batch.status.not_in(TERMINAL_BATCH_STATUSES)
    )


def _reclaim(storage: Storage, rows: Iterable[File]) -> None:
    """Delete the bytes of files already invisible; an empty key marks them reclaimed."""
    for row in rows:
        storage.delete(row.storage_key)
        row.storage_key = ""


def _unreclaimed(session: Session, ids: Sequence[str] | None = None) -> Sequence[File]:
    stmt = select(File).where(
        File.deleted_at.is_not(None), File.storage_key != "", _not_read_by_running_batch()
    )
    if ids is not None:
        stmt = stmt.where(File.id.in_(ids))
    return session.scalars(stmt.order_by(File.seq).limit(SWEEP_LIMIT)).all()


def delete_file(session: Session, project_id: str, file_id: str) -> FileDeleted:
    """Delete a File: gone from the API at once; `reclaim_deleted` then removes its bytes."""
    get_file(session, project_id, file_id).deleted_at = now()
    return FileDeleted(id=file_id)


def reclaim_deleted(session: Session, storage: Storage, file_id: str) -> None:
    """Remove a deleted File's bytes, unless a running batch still reads them."""
    _reclaim(storage, _unreclaimed(session, [file_id]))


def expire_files(session: Session, storage: Storage, now: int) -> int:
    """Housekeeping: hide files whose `expires_at` has passed and reclaim their bytes.

    Also reclaims the bytes of deleted files once no running batch reads them.
    Runs in the caller's transaction; returns how many files expired.
    """
    expired = session.scalars(
        select(File)
        .where(File.deleted_at.is_(None), File.expires_at <= now)
        .order_by(File.seq)
        .limit(SWEEP_LIMIT)
    ).all()
    for row in expired:
        row.deleted_at = now
    session.flush()
    _reclaim(storage, _unreclaimed(session))
    return len(expired)
