"""Anthropic's Message Batches over the one batch core: another wire format, the same batch.

A Message Batch is a batch (`api` = anthropic, id `msgbatch_…`) whose input file the API
writes itself: each inline request becomes the JSONL line `{"custom_id", "method": "POST",
"url": "/v1/messages", "body": params}`. From there on it is every batch: validated, cut
into leased shards, run by workers through vLLM's Anthropic serving class, cancelled,
expired, finalized into output and error files, announced by webhooks. This module shows
it as Anthropic's `message_batch` object; `message_batch_results` reads its results.
"""

import time
from collections.abc import Iterable, Sequence
from contextlib import suppress
from datetime import UTC, datetime

import orjson
from sqlalchemy import bindparam, delete, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.progress import Progress
from app.core.states import TERMINAL_BATCH_STATUSES, BatchApi, BatchStatus
from app.db.models import Batch, BatchSchedule, ResultChunk, Shard, ShardAdapter
from app.endpoints import MESSAGES
from app.errors import OpenAIError
from app.ids import new_file_id, new_message_batch_id
from app.schemas.admin import Quota
from app.schemas.batches import BatchObject
from app.schemas.message_batches import (
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchPage,
    MessageBatchRequest,
    MessageBatchRequestCounts,
    ProcessingStatus,
)
from app.services import batches, quotas, served_models
from app.services.file_expiry import delete_file
from app.services.file_intake import LimitedWriter, batch_file_too_large, register_client_file
from app.services.files import file_storage_key
from app.services.pagination import Pages
from app.storage import Storage, StoredObject

# Anthropic's batches end within 24 hours; a deployment without a `24h` window uses its first.
COMPLETION_WINDOW = "24h"
_PROCESSING = {
    BatchStatus.CANCELLING: ProcessingStatus.CANCELING,
    **{status: ProcessingStatus.ENDED for status in TERMINAL_BATCH_STATUSES},
}
# What every request of a batch that ended with no output or error file became.
_ALL_REQUESTS = {
    BatchStatus.FAILED: "errored",
    BatchStatus.EXPIRED: "expired",
    BatchStatus.CANCELLED: "canceled",
}


def not_found(batch_id: str) -> OpenAIError:
    return OpenAIError(f"No message batch with id '{batch_id}'.", status_code=404)


def check_requests(settings: Settings, requests: Sequence[MessageBatchRequest]) -> None:
    """What Anthropic refuses at create (400): repeated custom_ids, a params without a model.

    And what this server's batches need: one model, served for `/v1/messages`.
    """
    seen: set[str] = set()
    models: set[str] = set()
    for index, request in enumerate(requests):
        if request.custom_id in seen:
            raise OpenAIError(
                f"requests.{index}.custom_id: the custom_id '{request.custom_id}' is used by "
                "an earlier request; custom_id values must be unique within a batch."
            )
        seen.add(request.custom_id)
        model = request.params.get("model")
        if not isinstance(model, str):
            raise OpenAIError(f"requests.{index}.params.model: Field required (a string).")
        models.add(model)
    if len(models) > 1:
        raise OpenAIError(
            f"A Message Batch on this server uses one model; these requests name {len(models)} "
            f"({', '.join(sorted(models)[:5])}). Send one batch per model."
        )
    model = models.pop()
    problem = served_models.problem(
        served_models.read(settings), settings, model, MESSAGES, repr(model)
    )
    if problem is not None:
        raise OpenAIError(f"requests.0.params.model: {problem[1]}")


def write_input(
    settings: Settings, storage: Storage, requests: Iterable[MessageBatchRequest]
) -> tuple[str, StoredObject]:
    """The batch's input file, committed to storage (no transaction open): its id and object."""
    file_id = new_file_id()
    writer = LimitedWriter(
        storage.writer(file_storage_key(file_id)),
        settings.max_batch_file_bytes,
        batch_file_too_large(settings),
    )
    try:
        for request in requests:
            line = {
                "custom_id": request.custom_id,
                "method": "POST",
                "url": MESSAGES,
                "body": request.params,
            }
            writer.write(orjson.dumps(line) + b"\n")
        return file_id, writer.commit()
    except BaseException:
        writer.abort()
        raise


def create(
    session: Session,
    settings: Settings,
    project_id: str,
    input_file: tuple[str, StoredObject],
    count: int,
    base_url: str,
) -> MessageBatch:
    """Records the input file and a `validating` batch of it: the OpenAI create, inline."""
    file_id, stored = input_file
    adding = {Quota.STORED_BYTES: stored.bytes, Quota.FILES: 1, Quota.UNFINISHED_BATCHES: 1}
    quotas.check(session, settings, project_id, adding)
    batch_id = new_message_batch_id()
    register_client_file(
        session,
        settings,
        project_id=project_id,
        file_id=file_id,
        filename=f"{batch_id}_requests.jsonl",
        purpose="batch",
        stored=stored,
        expires_after_seconds=None,
    )
    now = int(time.time())
    windows = settings.completion_windows
    window = COMPLETION_WINDOW if COMPLETION_WINDOW in windows else next(iter(windows))
    batch = Batch(
        id=batch_id,
        project_id=project_id,
        endpoint=MESSAGES,
        api=BatchApi.ANTHROPIC,
        input_file_id=file_id,
        completion_window=window,
        status=BatchStatus.VALIDATING,
        created_at=now,
        expires_at=now + windows[window],
        total=count,  # known now; validation counts the same lines again
    )
    session.add(batch)
    session.flush()
    return to_message_batch(batches.to_wire(batch, Progress()), base_url)


_BY_ID = select(Batch).where(
    Batch.id == bindparam("batch_id"),
    Batch.project_id == bindparam("project_id"),
    Batch.api == BatchApi.ANTHROPIC,
)
_PAGES = Pages(
    Batch,
    scope=[Batch.project_id == bindparam("project_id"), Batch.api == BatchApi.ANTHROPIC],
)


def find(session: Session, project_id: str, batch_id: str) -> Batch:
    """The project's Message Batch, or a 404 (an OpenAI batch too: it has no such view)."""
    batch = session.scalar(_BY_ID, {"batch_id": batch_id, "project_id": project_id})
    if batch is None:
        raise not_found(batch_id)
    return batch


def retrieve(session: Session, project_id: str, batch_id: str, base_url: str) -> MessageBatch:
    return _views(session, [find(session, project_id, batch_id)], base_url)[0]


def list_page(
    session: Session,
    project_id: str,
    base_url: str,
    *,
    before_id: str | None,
    after_id: str | None,
    limit: int,
) -> MessageBatchPage:
    """Newest first. `after_id`: the older batches after it; `before_id`: the newer ones."""
    if before_id is not None and after_id is not None:
        raise OpenAIError("Pass at most one of 'before_id' and 'after_id'.")
    params = {"project_id": project_id}
    if before_id is not None:
        page = _PAGES.page(session, params, after=before_id, limit=limit, order="asc")
        rows = list(reversed(page.rows))
    else:
        page = _PAGES.page(session, params, after=after_id, limit=limit, order="desc")
        rows = list(page.rows)
    data = _views(session, rows, base_url)
    return MessageBatchPage(
        data=data,
        has_more=page.has_more,
        first_id=data[0].id if data else None,
        last_id=data[-1].id if data else None,
    )


def cancel(session: Session, project_id: str, batch_id: str, base_url: str) -> MessageBatch:
    """`canceling` now (the OpenAI cancel); the finalizer ends it with `canceled` results."""
    find(session, project_id, batch_id)
    batches.cancel_batch(session, project_id, batch_id)
    session.expire_all()
    return retrieve(session, project_id, batch_id, base_url)


def delete_ended(
    session: Session, project_id: str, batch_id: str
) -> tuple[DeletedMessageBatch, list[str]]:
    """Removes an ended batch, its rows and files; the keys of any result chunks still stored,
    for the caller to remove once this commits."""
    batch = find(session, project_id, batch_id)
    if batch.status not in TERMINAL_BATCH_STATUSES:
        raise OpenAIError(
            f"Message Batch {batch_id} is still processing: cancel it, and delete it once "
            "its processing_status is 'ended'."
        )
    shards = select(Shard.id).where(Shard.batch_id == batch_id)
    chunk_keys = list(
        session.scalars(select(ResultChunk.storage_key).where(ResultChunk.shard_id.in_(shards)))
    )
    session.execute(delete(ResultChunk).where(ResultChunk.shard_id.in_(shards)))
    session.execute(delete(ShardAdapter).where(ShardAdapter.shard_id.in_(shards)))
    session.execute(delete(Shard).where(Shard.batch_id == batch_id))
    session.execute(delete(BatchSchedule).where(BatchSchedule.batch_id == batch_id))
    files = [batch.input_file_id, batch.output_file_id, batch.error_file_id]
    session.delete(batch)
    session.flush()
    for file_id in files:
        if file_id is not None:
            _delete_file_if_present(session, project_id, file_id)
    return DeletedMessageBatch(id=batch_id), chunk_keys


def _delete_file_if_present(session: Session, project_id: str, file_id: str) -> None:
    # One already deleted or expired is left as it is: housekeeping reclaims its bytes.
    with suppress(OpenAIError):
        delete_file(session, project_id, file_id)


def _views(session: Session, rows: Sequence[Batch], base_url: str) -> list[MessageBatch]:
    running = [row.id for row in rows if row.status not in TERMINAL_BATCH_STATUSES]
    live = batches.live_progress(session, running)
    return [
        to_message_batch(batches.to_wire(row, live.get(row.id, Progress())), base_url)
        for row in rows
    ]


def to_message_batch(batch: BatchObject, base_url: str) -> MessageBatch:
    """The `message_batch` view of a batch: its status and counts in Anthropic's terms."""
    status = _PROCESSING.get(batch.status, ProcessingStatus.IN_PROGRESS)
    ended = status == ProcessingStatus.ENDED
    ended_at = batch.completed_at or batch.failed_at or batch.expired_at or batch.cancelled_at
    return MessageBatch(
        id=batch.id,
        processing_status=status,
        request_counts=_counts(batch, ended),
        created_at=rfc3339(batch.created_at),
        expires_at=rfc3339(batch.expires_at or batch.created_at),
        ended_at=rfc3339(ended_at) if ended and ended_at else None,
        cancel_initiated_at=rfc3339(batch.cancelling_at) if batch.cancelling_at else None,
        results_url=f"{base_url.rstrip('/')}/v1/messages/batches/{batch.id}/results"
        if ended
        else None,
    )


def _counts(batch: BatchObject, ended: bool) -> MessageBatchRequestCounts:
    counts = batch.request_counts
    if ended and batch.output_file_id is None and batch.error_file_id is None:
        # Ended before any request ran (validation failed, or cancelled or expired first).
        field = _ALL_REQUESTS.get(batch.status, "errored")
        return MessageBatchRequestCounts(**{field: counts.total})
    unrun = counts.cancelled + counts.expired
    return MessageBatchRequestCounts(
        processing=max(counts.total - counts.completed - counts.failed, 0),
        succeeded=counts.completed,
        errored=counts.failed - unrun,
        canceled=counts.cancelled,
        expired=counts.expired,
    )


def rfc3339(unix_seconds: int) -> str:
    return datetime.fromtimestamp(unix_seconds, UTC).isoformat().replace("+00:00", "Z")
