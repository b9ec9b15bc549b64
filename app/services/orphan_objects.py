"""Stored objects that no row names, removed once older than a safe age.

A process killed between writing an object and committing the row that names it leaves the
object behind: a result chunk, a finalizer's output or error file, an uploaded file or part,
a readiness probe. Every writer commits its row right after its object, so an object older
than the safe age that no row names will never be named: it goes. A younger one may be a
write in flight, and stays.

Each call looks at a bounded slice of overnight's folders (`KEY_FOLDERS`) in key order and
resumes after it at the next call, starting over once it reaches the end, so that a store of
any size is covered in turn. Only keys of the shapes overnight writes are judged; anything
else in those folders is left alone. Ages are by the store's clock (a file's mtime, S3's
LastModified) against this host's: the safe age is hours, far beyond any clock skew.
"""

import re
import time
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import File, ResultChunk, Shard, UploadPart
from app.storage import Storage
from app.storage.base import KEY_FOLDERS, ListedObject

_FILE = re.compile(r"^files/(?P<id>[^/]+)$")
_PART = re.compile(r"^uploads/[^/]+/(?P<id>[^/]+)$")
_CHUNK = re.compile(r"^batches/(?P<id>[^/]+)/shards/")
_PROBE = re.compile(r"^health/probe-[0-9a-f]+$")
# Keys looked up in one query.
_KEYS_PER_QUERY = 500


class OrphanSweep:
    """Where the sweep of one store has got to; one per store and process."""

    def __init__(self) -> None:
        self.after = ""

    def next_slice(self, storage: Storage, budget: int) -> list[ListedObject]:
        """The next `budget` objects after the last slice; from the start again at the end."""
        listed = list(islice(_listing(storage, self.after), budget))
        self.after = listed[-1].key if len(listed) == budget else ""
        return listed


def _listing(storage: Storage, after: str) -> Iterator[ListedObject]:
    for folder in KEY_FOLDERS:  # in key order, so one cursor serves them all
        yield from storage.scan(folder, after)


def old_keys(listed: Iterable[ListedObject], older_than_seconds: float) -> list[str]:
    cutoff = time.time() - older_than_seconds
    return [o.key for o in listed if o.modified_at < cutoff]


def unnamed(session: Session, keys: Sequence[str]) -> list[str]:
    """Of `keys`, those of overnight's shapes that no row names."""
    named: set[str] = set()
    for start in range(0, len(keys), _KEYS_PER_QUERY):
        named |= _named(session, keys[start : start + _KEYS_PER_QUERY])
    return [key for key in keys if key not in named and _judged(key)]


def _judged(key: str) -> bool:
    return any(shape.match(key) for shape in (_FILE, _PART, _CHUNK, _PROBE))


def _named(session: Session, keys: Sequence[str]) -> set[str]:
    file_ids = _ids(_FILE, keys)
    part_ids = _ids(_PART, keys)
    batch_ids = _ids(_CHUNK, keys)
    named: set[str] = set()
    if file_ids:
        named |= set(session.scalars(select(File.storage_key).where(File.id.in_(file_ids))))
    if part_ids:
        rows = select(UploadPart.storage_key).where(UploadPart.id.in_(part_ids))
        named |= set(session.scalars(rows))
    if batch_ids:
        chunks = (
            select(ResultChunk.storage_key)
            .join(Shard, Shard.id == ResultChunk.shard_id)
            .where(Shard.batch_id.in_(batch_ids), ResultChunk.storage_key.in_(keys))
        )
        named |= set(session.scalars(chunks))
    return named


def _ids(shape: re.Pattern[str], keys: Iterable[str]) -> list[str]:
    return sorted({m["id"] for key in keys if (m := shape.match(key))})
