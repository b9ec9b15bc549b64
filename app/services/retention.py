"""Retention: what the deployment keeps once work has ended, so that neither the database
nor the store grows for ever.

One pass removes, each after its own age (`retention_*` settings), what no API shows any
more (`app.services.prune_rows`), then sweeps a slice of the store for objects no row names
(`app.services.orphan_objects`). Every step is bounded (`retention_rows_per_pass`,
`retention_objects_per_pass`), and removes objects before the rows that name them, so a pass
killed anywhere leaves nothing a later pass cannot finish. The housekeeping loop of every API
replica calls `retain`; one replica at a time runs it (a singleton lease), though two at once
would only repeat each other's deletes.
"""

import logging
from dataclasses import dataclass, fields

from app.config import Settings
from app.db.session import read_scope, session_scope
from app.services import prune_rows, singleton_lease
from app.services.orphan_objects import OrphanSweep, old_keys, unnamed
from app.services.steps.chunk_cleanup import delete_chunks
from app.storage import Storage, storage_of

log = logging.getLogger("overnight.retention")

# The singleton lease a retention pass runs under.
RETENTION = "retention"

_sweeps: dict[str, OrphanSweep] = {}


@dataclass
class Pruned:
    """What one pass removed."""

    batch_rows: int = 0
    chunks: int = 0
    deliveries: int = 0
    workers: int = 0
    files: int = 0
    uploads: int = 0
    objects: int = 0

    def __bool__(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


def retain(settings: Settings, owner: str) -> Pruned | None:
    """One retention pass if it is this process's turn; None if another replica holds it."""
    with session_scope(settings) as session:
        hold_for = settings.retention_interval_seconds + settings.lease_seconds
        if not singleton_lease.hold(session, RETENTION, owner, hold_for):
            return None
    storage = storage_of(settings)
    pruned = Pruned()
    _prune_batches(settings, storage, pruned)
    _prune_rows(settings, pruned)
    _prune_uploads(settings, storage, pruned)
    pruned.objects = sweep_orphans(settings, storage)
    if pruned:
        log.info("retention removed %s", pruned)
    return pruned


def _prune_batches(settings: Settings, storage: Storage, pruned: Pruned) -> None:
    with read_scope(settings) as session:
        batch_ids = prune_rows.ended_batches_with_rows(
            session, settings.retention_batch_rows_seconds, settings.retention_rows_per_pass
        )
    if not batch_ids:
        return
    for batch_id in batch_ids:  # normally none left: the finalizer removed them
        pruned.chunks += delete_chunks(settings, storage, batch_id)
    with session_scope(settings) as session:
        pruned.batch_rows += prune_rows.delete_batch_rows(session, batch_ids)


def _prune_rows(settings: Settings, pruned: Pruned) -> None:
    limit = settings.retention_rows_per_pass
    workers_age = max(settings.retention_workers_seconds, settings.served_model_memory_seconds)
    with session_scope(settings) as session:
        pruned.deliveries = prune_rows.prune_deliveries(
            session, settings.retention_deliveries_seconds, limit
        )
        pruned.workers = prune_rows.prune_workers(session, workers_age, limit)


def _prune_uploads(settings: Settings, storage: Storage, pruned: Pruned) -> None:
    age, limit = settings.retention_files_seconds, settings.retention_rows_per_pass
    with read_scope(settings) as session:
        parts = prune_rows.ended_uploads(session, age, limit)
    for keys in parts.values():
        for key in keys:
            storage.delete(key)
    with session_scope(settings) as session:
        pruned.uploads = prune_rows.delete_upload_rows(session, list(parts))
    # Files after uploads: a completed upload names its file until its own row is gone.
    with session_scope(settings) as session:
        pruned.files = prune_rows.prune_files(session, age, limit)


def sweep_orphans(settings: Settings, storage: Storage) -> int:
    """Removes the objects of the store's next slice that are old and that no row names."""
    sweep = _sweeps.setdefault(settings.storage_location, OrphanSweep())
    listed = sweep.next_slice(storage, settings.retention_objects_per_pass)
    candidates = old_keys(listed, settings.retention_orphan_seconds)
    if not candidates:
        return 0
    with read_scope(settings) as session:
        orphans = unnamed(session, candidates)
    for key in orphans:
        storage.delete(key)
    return len(orphans)
