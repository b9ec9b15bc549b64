"""Byte storage behind one small interface: a local directory now, S3 later."""

from functools import lru_cache

from app.storage.base import Storage, StoredObject, Writer
from app.storage.local import LocalStorage

__all__ = ["LocalStorage", "Storage", "StoredObject", "Writer", "storage_for"]


@lru_cache
def storage_for(root: str) -> Storage:
    return LocalStorage(root)
