"""Byte storage behind one small interface: a local directory or an S3 bucket.

It knows nothing of the rest of the project; `app.config` checks an S3 URL with its parser.
"""

from functools import lru_cache
from typing import Protocol

from app.storage.base import Storage, StoredObject, Writer
from app.storage.local import LocalStorage


class StoreSettings(Protocol):
    """What `storage_of` reads of the settings."""

    @property
    def storage_location(self) -> str: ...

    @property
    def s3_endpoint_url(self) -> str | None: ...


__all__ = [
    "LocalStorage",
    "Storage",
    "StoredObject",
    "Writer",
    "storage_for",
    "storage_of",
]


@lru_cache
def storage_for(location: str, endpoint_url: str | None = None) -> Storage:
    """The store at `location`: `s3://bucket/optional/prefix` or a local directory.

    `endpoint_url` points S3 at MinIO or another S3-compatible store; a directory ignores it.
    """
    if location.startswith("s3://"):
        # boto3 is imported where a bucket is used: the CLI's commands start without it.
        from app.storage.s3 import S3Storage

        return S3Storage.from_url(location, endpoint_url)
    return LocalStorage(location)


def storage_of(settings: StoreSettings) -> Storage:
    """The deployment's store, as its settings name it."""
    return storage_for(settings.storage_location, settings.s3_endpoint_url)
