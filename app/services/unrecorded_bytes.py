"""Bytes a request stored before the transaction that records them, removed when that
transaction did not commit.

A transaction that raised may have committed all the same: its COMMIT went through and only
the reply was lost (a dropped connection). So the bytes go only once the database says no row
names them; if it cannot say, they stay: bytes no row names are only wasted space, a visible
File without its bytes is a broken one.
"""

import logging

from sqlalchemy import select

from app.config import Settings
from app.db.models import File, UploadPart
from app.db.session import read_session_factory
from app.storage import Storage

log = logging.getLogger("overnight.storage")


def delete_unless_file(settings: Settings, storage: Storage, file_id: str, key: str) -> bool:
    """Deletes `key` unless File `file_id` names it; True if it was deleted."""
    return _delete_unless_named(settings, storage, File, file_id, key)


def delete_unless_part(settings: Settings, storage: Storage, part_id: str, key: str) -> bool:
    """Deletes `key` unless upload part `part_id` names it; True if it was deleted."""
    return _delete_unless_named(settings, storage, UploadPart, part_id, key)


def _delete_unless_named(
    settings: Settings, storage: Storage, row: type[File] | type[UploadPart], row_id: str, key: str
) -> bool:
    named = select(row.id).where(row.id == row_id, row.storage_key == key)
    try:
        with read_session_factory(settings.sqlalchemy_url)() as session:
            if session.scalar(named) is not None:
                return False
    except Exception as exc:
        log.warning("kept object %s: cannot tell whether a row names it: %s", key, exc)
        return False
    storage.delete(key)
    return True
