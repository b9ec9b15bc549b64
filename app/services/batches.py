"""The Batches API's work: create (synchronous checks), retrieve, list and cancel."""

import time
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Row, and_, bindparam, func, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.progress import PROGRESS_FIELDS, Progress
from app.core.states import CANCELLABLE_BATCH_STATUSES, TERMINAL_BATCH_STATUSES, BatchStatus
from app.db.models import Batch, Shard
from app.endpoints import SUPPORTED, canonical
from app.errors import OpenAIError, not_found
from app.ids import new_batch_id
from app.schemas.admin import Quota
from app.schemas.batches import (
    BatchErrors,
    BatchObject,
    BatchRequestCounts,
    BatchUsage,
    CreateBatchRequest,
    InputTokensDetails,
    OutputTokensDetails,
)
from app.schemas.common import ListObject
from app.services import quotas
from app.services.files import get_file
from app.services.pagination import Pages, check_limit

MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100


def create_batch(
    session: Session, settings: Settings, project_id: str, params: CreateBatchRequest
) -> BatchObject:
    """Checks the request and records a `validating` batch; validation follows."""
    _check_endpoint(params.endpoint)
    window_seconds = _window_seconds(settings, params.completion_window)
    _check_metadata(params.metadata)
    input_file = get_file(session, project_id, params.input_file_id, param="input_file_id")
    if input_file.purpose != "batch":
        raise OpenAIError(
            f"Invalid 'input_file_id': {input_file.id} has purpose '{input_file.purpose}'. "
            "A batch's input file must be uploaded with purpose 'batch'.",
            param="input_file_id",
            code="invalid_value",
        )
    quotas.check(session, settings, project_id, {Quota.UNFINISHED_BATCHES: 1})
    now = int(time.time())
    batch = Batch(
        id=new_batch_id(),
        project_id=project_id,
        endpoint=params.endpoint,
        input_file_id=input_file.id,
        completion_window=params.completion_window,
        status=BatchStatus.VALIDATING,
        metadata_=params.metadata,
        output_expires_after=(
            params.output_expires_after.seconds if params.output_expires_after else None
        ),
        created_at=now,
        expires_at=now + window_seconds,
    )
    session.add(batch)
    session.flush()
    return to_wire(batch, Progress())


def _check_endpoint(endpoint: str) -> None:
    if canonical(endpoint) not in SUPPORTED:
        raise OpenAIError(
            f"Invalid value for 'endpoint': '{endpoint}'. This server executes batches for "
            f"{', '.join(SUPPORTED)}.",
            param="endpoint",
            code="invalid_value",
        )


def _window_seconds(settings: Settings, window: str) -> int:
    seconds = settings.completion_windows.get(window)
    if seconds is None:
        accepted = ", ".join(f"'{w}'" for w in settings.completion_windows)
        raise OpenAIError(
            f"Invalid value for 'completion_window': '{window}'. Supported values are: {accepted}.",
            param="completion_window",
            code="invalid_value",
        )
    return seconds


def _check_metadata(metadata: dict[str, str] | None) -> None:
    if metadata is None:
        return
    if len(metadata) > MAX_METADATA_PAIRS:
        raise OpenAIError(
            f"Invalid 'metadata': too many properties. Expected an object with at most "
            f"{MAX_METADATA_PAIRS} properties, but got an object with {len(metadata)} "
            "properties instead.",
            param="metadata",
            code="object_above_max_properties",
        )
    for key, value in metadata.items():
        if len(key) > MAX_METADATA_KEY_CHARS:
            raise _too_long("metadata", MAX_METADATA_KEY_CHARS, len(key), "metadata key")
        if len(value) > MAX_METADATA_VALUE_CHARS:
            raise _too_long(f"metadata.{key}", MAX_METADATA_VALUE_CHARS, len(value), "string")


def _too_long(param: str, limit: int, got: int, what: str) -> OpenAIError:
    return OpenAIError(
        f"Invalid '{param}': string too long. Expected a {what} with maximum length {limit}, "
        f"but got a {what} with length {got} instead.",
        param=param,
        code="string_above_max_length",
    )


def get_batch(session: Session, project_id: str, batch_id: str) -> BatchObject:
    return _to_wire_live(_find(session, project_id, batch_id))


def list_batches(
    session: Session, project_id: str, after: str | None, limit: int
) -> ListObject[BatchObject]:
    """Newest first; `after` is the id of the last batch of the previous page."""
    check_limit(limit, MAX_LIST_LIMIT)
    page = _PAGES.page(session, {"project_id": project_id}, after=after, limit=limit, order="desc")
    return ListObject[BatchObject].of([_to_wire_live(row) for row in page.rows], page.has_more)


def cancel_batch(session: Session, project_id: str, batch_id: str) -> BatchObject:
    """`cancelling` now; the finalizer (housekeeping or a worker) ends it `cancelled`.

    A batch already `finalizing` (or cancelling, or cancelled) is answered as it is; a
    finished one is a 409."""
    session.execute(
        update(Batch)
        .where(
            Batch.id == batch_id,
            Batch.project_id == project_id,
            Batch.status.in_(CANCELLABLE_BATCH_STATUSES),
        )
        .values(status=BatchStatus.CANCELLING, cancelling_at=int(time.time()))
        .execution_options(synchronize_session=False)
    )
    batch = _find(session, project_id, batch_id)
    if batch.status in (BatchStatus.FAILED, BatchStatus.COMPLETED, BatchStatus.EXPIRED):
        raise OpenAIError(
            f"Cannot cancel a batch with status '{batch.status}'.",
            status_code=409,
            type="invalid_request_error",
        )
    return _to_wire_live(batch)


def cancel_any_batch(session: Session, batch_id: str) -> BatchObject:
    """`cancel_batch` for an operator, whatever the batch's project."""
    project_id = session.scalar(select(Batch.project_id).where(Batch.id == batch_id))
    if project_id is None:
        raise not_found("Batch", batch_id)
    return cancel_batch(session, project_id, batch_id)


# The columns `to_wire` reads, then the sums over the batch's shards while it runs (none
# once it is terminal): a batch and its live progress in one query, as Core rows (loading
# ORM objects costs more than the query).
_WIRE_COLUMNS = (
    Batch.id,
    Batch.endpoint,
    Batch.model,
    Batch.errors,
    Batch.input_file_id,
    Batch.completion_window,
    Batch.status,
    Batch.output_file_id,
    Batch.error_file_id,
    Batch.created_at,
    Batch.in_progress_at,
    Batch.expires_at,
    Batch.finalizing_at,
    Batch.completed_at,
    Batch.failed_at,
    Batch.expired_at,
    Batch.cancelling_at,
    Batch.cancelled_at,
    Batch.total,
    Batch.cancelled,
    Batch.expired,
    Batch.metadata_.label("metadata_"),
    *(getattr(Batch, name) for name in PROGRESS_FIELDS),
)
_LIVE = tuple(f"live_{name}" for name in PROGRESS_FIELDS)
# Grouped by the primary key, so that every batch column may be selected (PostgreSQL too).
_WITH_LIVE = (
    select(
        *_WIRE_COLUMNS,
        *(
            func.sum(getattr(Shard, name)).label(live)
            for name, live in zip(PROGRESS_FIELDS, _LIVE, strict=True)
        ),
    )
    .select_from(Batch)
    .outerjoin(
        Shard, and_(Shard.batch_id == Batch.id, Batch.status.not_in(TERMINAL_BATCH_STATUSES))
    )
    .group_by(Batch.seq)
)
# Built once: building a statement costs more than running it on a warm connection.
_BATCH_BY_ID = _WITH_LIVE.where(
    Batch.id == bindparam("batch_id"), Batch.project_id == bindparam("project_id")
)
_PAGES = Pages(Batch, query=_WITH_LIVE, scope=[Batch.project_id == bindparam("project_id")])
_LIVE_PROGRESS = (
    select(Shard.batch_id, *(func.sum(getattr(Shard, name)) for name in PROGRESS_FIELDS))
    .where(Shard.batch_id.in_(bindparam("batch_ids", expanding=True)))
    .group_by(Shard.batch_id)
)


def _find(session: Session, project_id: str, batch_id: str) -> Row[*tuple[Any, ...]]:
    """The batch's wire columns and live sums (`_WITH_LIVE`), or OpenAI's 404."""
    row = (
        session.connection()
        .execute(_BATCH_BY_ID, {"batch_id": batch_id, "project_id": project_id})
        .first()
    )
    if row is None:
        raise not_found("Batch", batch_id)
    return row


def _to_wire_live(row: Row[*tuple[Any, ...]]) -> BatchObject:
    return to_wire(row, Progress(*(int(getattr(row, live) or 0) for live in _LIVE)))


def live_progress(session: Session, batch_ids: Iterable[str]) -> dict[str, Progress]:
    """Sums over the shards: what workers have persisted so far, per batch."""
    ids = list(batch_ids)
    if not ids:
        return {}
    rows = session.execute(_LIVE_PROGRESS, {"batch_ids": ids}).all()
    return {row[0]: Progress(*(int(v or 0) for v in row[1:])) for row in rows}


def to_wire(batch: Batch | Row[*tuple[Any, ...]], live: Progress) -> BatchObject:
    """The Batch object, of a `Batch` or a row of its columns with the same names; a
    terminal batch shows its own final totals, a running one `live`."""
    if batch.status in TERMINAL_BATCH_STATUSES:
        live = Progress.of(batch)
    return BatchObject(
        id=batch.id,
        endpoint=batch.endpoint,
        model=batch.model,
        errors=BatchErrors(data=batch.errors) if batch.errors else None,
        input_file_id=batch.input_file_id,
        completion_window=batch.completion_window,
        status=batch.status,
        output_file_id=batch.output_file_id,
        error_file_id=batch.error_file_id,
        created_at=batch.created_at,
        in_progress_at=batch.in_progress_at,
        expires_at=batch.expires_at,
        finalizing_at=batch.finalizing_at,
        completed_at=batch.completed_at,
        failed_at=batch.failed_at,
        expired_at=batch.expired_at,
        cancelling_at=batch.cancelling_at,
        cancelled_at=batch.cancelled_at,
        request_counts=BatchRequestCounts(
            total=batch.total or 0,
            completed=live.completed,
            failed=live.failed,
            cancelled=batch.cancelled,
            expired=batch.expired,
        ),
        usage=BatchUsage(
            input_tokens=live.input_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=live.cached_tokens),
            output_tokens=live.output_tokens,
            output_tokens_details=OutputTokensDetails(reasoning_tokens=live.reasoning_tokens),
            total_tokens=live.input_tokens + live.output_tokens,
        ),
        metadata=batch.metadata_,
    )
