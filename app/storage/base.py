"""The storage interface every backend implements, with the same atomicity rules.

Objects are immutable once written and never visible half-written: a writer
commits the whole object at once or nothing.
"""

import hashlib
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import urlsplit

from app.core.redaction import masked_url

READ_CHUNK = 1 << 20
# The folders overnight keeps its objects in (files, upload parts, batch results, readiness
# probes): a bucket may hold other applications' objects too, so sweeps look only here.
KEY_FOLDERS = ("batches/", "files/", "health/", "uploads/")

_SAFE_KEY = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-/]*$")


def check_key(key: str) -> str:
    """The key itself if it is safe as a path and an object name, else `ValueError`."""
    if not _SAFE_KEY.match(key) or ".." in key.split("/"):
        raise ValueError(f"unsafe storage key: {key!r}")
    return key


class StorageFull(Exception):
    """The store refused a write for want of space (a full disk, an S3 quota): the object
    being written was discarded, nothing half-written is visible."""


def parse_s3_url(url: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → (`bucket`, `some/prefix/`); `ValueError` if malformed."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc or parts.query or parts.fragment:
        raise ValueError(
            f"storage URL must look like s3://bucket/optional/prefix, not {masked_url(url)!r}"
        )
    prefix = parts.path.strip("/")
    return parts.netloc, (check_key(prefix) + "/" if prefix else "")


@dataclass(frozen=True)
class StoredObject:
    key: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class ListedObject:
    """An object as a listing shows it: its key, and when it was written (Unix seconds, by
    the store's own clock)."""

    key: str
    modified_at: float


class Writer(Protocol):
    key: str

    def write(self, data: bytes) -> None: ...

    @property
    def bytes_written(self) -> int: ...

    def commit(self) -> StoredObject: ...

    def abort(self) -> None: ...


class Storage(Protocol):
    def writer(self, key: str) -> Writer:
        """Start an object; nothing is visible until `commit()`."""
        ...

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """Stream `[start, end)` of an object in chunks."""
        ...

    def size(self, key: str) -> int: ...

    def exists(self, key: str) -> bool: ...

    def list(self, prefix: str) -> Iterator[str]: ...

    def scan(self, folder: str, start_after: str = "") -> Iterator[ListedObject]:
        """The objects under `folder` (a prefix ending in "/") in key order, those after
        `start_after` only, so that a long listing can resume where it stopped."""
        ...

    def delete(self, key: str) -> None:
        """Remove an object; a missing one is not an error."""
        ...

    def sweep_temp(self, older_than_seconds: float) -> int:
        """Discard what writers that died left behind; returns how many leftovers went."""
        ...


class HashingWriter(ABC):
    """What every backend's writer shares: it counts and hashes what it is given and, once its
    backend has made the whole object visible, reports what was stored."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.bytes_written = 0
        self._sha256 = hashlib.sha256()

    def write(self, data: bytes) -> None:
        self._sha256.update(data)
        self.bytes_written += len(data)
        self._write(data)

    def commit(self) -> StoredObject:
        self._persist()
        return StoredObject(self.key, self.bytes_written, self._sha256.hexdigest())

    @abstractmethod
    def abort(self) -> None: ...

    @abstractmethod
    def _write(self, data: bytes) -> None: ...

    @abstractmethod
    def _persist(self) -> None:
        """Make the whole object visible at its key, or discard it and raise."""


def put(storage: Storage, key: str, chunks: Iterable[bytes]) -> StoredObject:
    """Write a whole object from an iterable, atomically."""
    writer = storage.writer(key)
    try:
        for chunk in chunks:
            writer.write(chunk)
    except BaseException:
        writer.abort()
        raise
    return writer.commit()
