"""Retention of rows: each kind goes after its age and is kept before it; a batch that has
not ended loses nothing."""

import time

from sqlalchemy import update

from app.config import Settings
from app.core.states import BatchStatus, DeliveryStatus
from app.db.models import (
    File,
    RegisteredWorker,
    Shard,
    Upload,
    UploadPart,
    WebhookDelivery,
)
from app.db.session import session_scope
from app.schemas.uploads import UploadStatus
from app.services import batches
from app.services.file_expiry import delete_file, reclaim_deleted
from app.services.retention import retain
from app.services.steps.finalization import finalize_ready_batches
from app.services.webhook_outbox import new_delivery
from app.storage import storage_of
from app.storage.base import put
from tests import batch_sim as sim
from tests.retention_sim import (
    DAY,
    OWNER,
    Rows,
    age_batch,
    chunk_keys,
    custom_ids_of,
    ended_batch,
    keeping,
    project_id,
    remaining,
    rows_of,
    running_batch,
    subscribed_endpoint,
    totals,
)
from worker import registry


def test_an_ended_batch_keeps_its_batch_and_files_and_loses_its_rows_after_the_age(
    settings: Settings,
) -> None:
    settings = keeping(settings)
    storage = storage_of(settings)
    old, recent = ended_batch(settings), ended_batch(settings)
    running = running_batch(settings)
    before = {b: rows_of(settings, b) for b in (old, recent, running)}
    assert before[old].shards  # something to prune
    assert before[running].chunks
    with session_scope(settings) as session:
        shown = batches.get_batch(session, project_id(settings), old)
    counted = totals(settings)
    age_batch(settings, old, 2 * DAY)
    age_batch(settings, running, 2 * DAY)

    pruned = retain(settings, OWNER)

    assert pruned is not None and pruned.batch_rows >= before[old].shards
    assert rows_of(settings, old) == Rows(0, 0)
    assert rows_of(settings, recent) == before[recent]
    assert rows_of(settings, running) == before[running]
    assert all(storage.exists(key) for key in chunk_keys(settings, running))
    with session_scope(settings) as session:
        kept = batches.get_batch(session, project_id(settings), old)
    assert kept.model_dump(exclude={"created_at", "in_progress_at", "completed_at"}) == (
        shown.model_dump(exclude={"created_at", "in_progress_at", "completed_at"})
    )
    answered = custom_ids_of(storage, settings, kept.output_file_id)
    answered += custom_ids_of(storage, settings, kept.error_file_id)
    assert sorted(answered) == sorted(f"req-{i}" for i in range(5))
    assert totals(settings).done_by_model == counted.done_by_model


def test_a_batch_that_has_not_ended_loses_nothing_even_at_age_zero(settings: Settings) -> None:
    nothing_kept = {
        name: 0.0
        for name in (
            "retention_batch_rows_seconds",
            "retention_files_seconds",
            "retention_orphan_seconds",
        )
    }
    settings = keeping(settings, **nothing_kept)
    storage = storage_of(settings)
    running = running_batch(settings)
    cancelling = running_batch(settings)
    with session_scope(settings) as session:
        batches.cancel_batch(session, project_id(settings), cancelling)
    rows = {b: rows_of(settings, b) for b in (running, cancelling)}
    keys = chunk_keys(settings, running) + chunk_keys(settings, cancelling)
    time.sleep(0.05)  # every object is now older than the age

    retain(settings, OWNER)

    assert {b: rows_of(settings, b) for b in (running, cancelling)} == rows
    assert all(storage.exists(key) for key in keys)
    # Their worker dies; both end with every request answered once: nothing they needed went.
    with session_scope(settings) as session:
        session.execute(update(Shard).values(heartbeat_at=Shard.heartbeat_at - 3600))
    sim.run_batch(settings, running)
    finalize_ready_batches(settings, OWNER)
    for batch_id in (running, cancelling):
        batch = sim.load_batch(settings, batch_id)
        assert batch.status in (BatchStatus.COMPLETED, BatchStatus.CANCELLED)
        answered = custom_ids_of(storage, settings, batch.output_file_id)
        answered += custom_ids_of(storage, settings, batch.error_file_id)
        assert sorted(answered) == sorted(f"req-{i}" for i in range(12))


def _delivery(settings: Settings, endpoint_id: str, status: DeliveryStatus, age: float) -> str:
    then = time.time() - age
    row = new_delivery(endpoint_id, "evt_x", "batch.completed", "{}", then)  # type: ignore[arg-type]
    row.status = status
    if status == DeliveryStatus.DELIVERED:
        row.delivered_at = row.last_attempt_at = then
    elif status == DeliveryStatus.FAILED:
        row.last_attempt_at = then
    with session_scope(settings) as session:
        session.add(row)
    return row.id


def _worker(settings: Settings, worker_id: str, age: float, stop: bool) -> None:
    with session_scope(settings) as session:
        registry.loading(session, worker_id, sim.MODEL, time.time() - age)
        if stop:
            registry.stopped(session, worker_id)
        session.execute(
            update(RegisteredWorker)
            .where(RegisteredWorker.id == worker_id)
            .values(heartbeat_at=time.time() - age)
        )


def test_deliveries_and_workers_go_after_their_age(settings: Settings) -> None:
    settings = keeping(settings)
    endpoint = subscribed_endpoint(settings)
    old_delivered = _delivery(settings, endpoint, DeliveryStatus.DELIVERED, 2 * DAY)
    old_failed = _delivery(settings, endpoint, DeliveryStatus.FAILED, 2 * DAY)
    new_delivered = _delivery(settings, endpoint, DeliveryStatus.DELIVERED, 60)
    old_pending = _delivery(settings, endpoint, DeliveryStatus.PENDING, 2 * DAY)
    _worker(settings, "w-old-stopped", 2 * DAY, stop=True)
    _worker(settings, "w-old-killed", 2 * DAY, stop=False)
    _worker(settings, "w-new-stopped", 60, stop=True)
    _worker(settings, "w-live", 0, stop=False)
    _worker(settings, "w-remembered", 2 * DAY, stop=True)

    # The names an old worker served are remembered three days: it stays until then.
    remembering = settings.model_copy(update={"served_model_memory_seconds": 3 * DAY})
    retain(remembering, OWNER)
    workers = ["w-old-stopped", "w-old-killed", "w-new-stopped", "w-live", "w-remembered"]
    assert remaining(settings, RegisteredWorker.id, workers) == set(workers)
    with session_scope(settings) as session:
        session.execute(
            update(RegisteredWorker)
            .where(RegisteredWorker.id == "w-remembered")
            .values(heartbeat_at=time.time() - 4 * DAY)
        )

    retain(settings, OWNER)

    deliveries = [old_delivered, old_failed, new_delivered, old_pending]
    assert remaining(settings, WebhookDelivery.id, deliveries) == {new_delivered, old_pending}
    assert remaining(settings, RegisteredWorker.id, workers) == {"w-new-stopped", "w-live"}


def _deleted_file(settings: Settings, age: float, reclaim: bool = True) -> str:
    file_id = sim.store_input_file(settings, sim.requests_file(2))
    _delete(settings, file_id, age, reclaim)
    return file_id


def _delete(settings: Settings, file_id: str, age: float, reclaim: bool = True) -> None:
    with session_scope(settings) as session:
        delete_file(session, project_id(settings), file_id)
        if reclaim:
            reclaim_deleted(session, storage_of(settings), file_id)
        session.execute(
            update(File).where(File.id == file_id).values(deleted_at=int(time.time() - age))
        )


def _ended_upload(settings: Settings, status: UploadStatus, age: float) -> tuple[str, str]:
    """An upload that ended `age` seconds after its expiry, with one part: (its id, part key)."""
    storage = storage_of(settings)
    then = int(time.time() - age)
    upload = Upload(
        id=f"upload_{status}{int(age)}",
        project_id=project_id(settings),
        filename="in.jsonl",
        purpose="batch",
        bytes=3,
        mime_type="text/jsonl",
        status=status,
        created_at=then - 3600,
        expires_at=then,
    )
    key = put(storage, f"uploads/{upload.id}/part_{upload.id}", [b"abc"]).key
    part = UploadPart(id=f"part_{upload.id}", upload_id=upload.id, bytes=3, storage_key=key)
    with session_scope(settings) as session:
        session.add(upload)
        session.flush()
        session.add(part)
        part.created_at = then
    return upload.id, key


def test_deleted_files_and_ended_uploads_go_after_their_age(settings: Settings) -> None:
    settings = keeping(settings)
    storage = storage_of(settings)
    old = _deleted_file(settings, 2 * DAY)
    recent = _deleted_file(settings, 60)
    unreclaimed = _deleted_file(settings, 2 * DAY, reclaim=False)
    input_of_batch = sim.load_batch(settings, ended_batch(settings)).input_file_id
    _delete(settings, input_of_batch, 2 * DAY)
    expired, expired_part = _ended_upload(settings, UploadStatus.EXPIRED, 2 * DAY)
    cancelled, cancelled_part = _ended_upload(settings, UploadStatus.CANCELLED, 60)
    pending, pending_part = _ended_upload(settings, UploadStatus.PENDING, 2 * DAY)

    retain(settings, OWNER)

    files = [old, recent, unreclaimed, input_of_batch]
    assert remaining(settings, File.id, files) == {recent, unreclaimed, input_of_batch}
    uploads = [expired, cancelled, pending]
    assert remaining(settings, Upload.id, uploads) == {cancelled, pending}
    parts = [f"part_{u}" for u in uploads]
    assert remaining(settings, UploadPart.id, parts) == {f"part_{cancelled}", f"part_{pending}"}
    assert not storage.exists(expired_part)
    assert storage.exists(cancelled_part) and storage.exists(pending_part)
