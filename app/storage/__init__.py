"""Byte storage behind one small interface: a local directory or an S3 bucket."""

from functools import lru_cache

from app.storage.base import Storage, StoredObject, Writer
from app.storage.local import LocalStorage
from app.storage.s3 import S3Storage

__all__ = ["LocalStorage", "S3Storage", "Storage", "StoredObject", "Writer", "storage_for"]


@lru_cache
def storage_for(location: str, endpoint_url: str | None = None) -> Storage:
    """The store at `location`: `s3://bucket/optional/prefix` or a local directory.

    `endpoint_url` points S3 at MinIO or another S3-compatible store; a directory ignores it.
    """
    if location.startswith("s3://"):
        return S3Storage.from_url(location, endpoint_url)
    return LocalStorage(location)
