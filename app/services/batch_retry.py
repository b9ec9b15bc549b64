"""Retrying what failed: a new batch of a finished batch's requests that may succeed now.

Retried are the requests that never ran (`batch_cancelled`, `batch_expired`,
`batch_failed`) and those answered 5xx; a 4xx the engine would give again only when asked
(`include_all`). The new batch's metadata says `retry_of`, its output files expire as the
original's would (`output_expires_after`); its output plus the original's
has every `custom_id` once. Bytes move between two transactions (`plan_retry`, then
`create_retry`), with none open while they are read and written.
"""

import time
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, File
from app.errors import OpenAIError, not_found
from app.ids import new_file_id
from app.schemas.admin import Quota
from app.schemas.batches import BatchObject, CreateBatchRequest
from app.schemas.common import ExpiresAfter
from app.services import quotas
from app.services.batches import MAX_METADATA_PAIRS, create_batch
from app.services.files import create_file_from_storage, file_storage_key
from app.services.jsonl import iter_lines
from app.storage import Storage, StoredObject
from app.storage.base import put

UNRUN_CODES = frozenset({"batch_cancelled", "batch_expired", "batch_failed"})


@dataclass(frozen=True)
class RetryPlan:
    batch_id: str
    project_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None
    output_expires_after: int | None
    input_key: str
    error_key: str


@dataclass(frozen=True)
class RetryInput:
    """The stored input file of the retry, not yet registered."""

    file_id: str
    stored: StoredObject


def plan_retry(session: Session, project_id: str | None, batch_id: str) -> RetryPlan:
    """What retrying the batch needs; `project_id` None is an admin's (any project)."""
    query = select(Batch).where(Batch.id == batch_id)
    if project_id is not None:
        query = query.where(Batch.project_id == project_id)
    batch = session.scalar(query)
    if batch is None:
        raise not_found("Batch", batch_id)
    if batch.status not in TERMINAL_BATCH_STATUSES:
        raise OpenAIError(
            f"Cannot retry a batch with status '{batch.status}': wait until it ends.",
            status_code=409,
        )
    if batch.error_file_id is None:
        raise _nothing_to_retry(batch_id)
    keys = dict(
        session.execute(
            select(File.id, File.storage_key).where(
                File.id.in_([batch.input_file_id, batch.error_file_id]), File.deleted_at.is_(None)
            )
        ).all()
    )
    if batch.input_file_id not in keys or batch.error_file_id not in keys:
        raise OpenAIError(
            f"Cannot retry {batch_id}: its input or error file has been deleted.",
            param="batch_id",
        )
    return RetryPlan(
        batch_id=batch.id,
        project_id=batch.project_id,
        endpoint=batch.endpoint,
        completion_window=batch.completion_window,
        metadata=batch.metadata_,
        output_expires_after=batch.output_expires_after,
        input_key=keys[batch.input_file_id],
        error_key=keys[batch.error_file_id],
    )


def is_retryable(error_line: dict[str, Any], include_all: bool) -> bool:
    """Whether a retry may change this error-file line's outcome (every line with `include_all`)."""
    if include_all:
        return True
    response = error_line.get("response")
    if isinstance(response, dict):
        status = response.get("status_code")
        return isinstance(status, int) and status >= 500
    error = error_line.get("error")
    return isinstance(error, dict) and error.get("code") in UNRUN_CODES


def write_retry_input(storage: Storage, plan: RetryPlan, include_all: bool) -> RetryInput:
    """Streams the original input lines of the retryable requests into a new stored file."""
    retry = set()
    for _line_no, raw in iter_lines(storage, plan.error_key):
        line = orjson.loads(raw)
        if is_retryable(line, include_all):
            retry.add(line.get("custom_id"))
    if not retry:
        raise _nothing_to_retry(plan.batch_id, include_all)
    file_id = new_file_id()
    chunks = (
        raw + b"\n"
        for _line_no, raw in iter_lines(storage, plan.input_key)
        if orjson.loads(raw).get("custom_id") in retry
    )
    return RetryInput(file_id, put(storage, file_storage_key(file_id), chunks))


def create_retry(
    session: Session, settings: Settings, plan: RetryPlan, written: RetryInput
) -> BatchObject:
    """Registers the retry's input file and creates the batch (`validating`)."""
    adding = {Quota.STORED_BYTES: written.stored.bytes, Quota.FILES: 1}
    quotas.check(session, settings, plan.project_id, adding)
    create_file_from_storage(
        session,
        project_id=plan.project_id,
        filename=f"{plan.batch_id}_retry.jsonl",
        purpose="batch",
        stored=written.stored,
        expires_at=int(time.time()) + settings.batch_file_ttl_seconds,
        file_id=written.file_id,
    )
    kept = list((plan.metadata or {}).items())[: MAX_METADATA_PAIRS - 1]
    params = CreateBatchRequest(
        input_file_id=written.file_id,
        endpoint=plan.endpoint,
        completion_window=plan.completion_window,
        metadata={**dict(kept), "retry_of": plan.batch_id},
        output_expires_after=(
            None
            if plan.output_expires_after is None
            else ExpiresAfter(anchor="created_at", seconds=plan.output_expires_after)
        ),
    )
    return create_batch(session, settings, plan.project_id, params)


def _nothing_to_retry(batch_id: str, include_all: bool = False) -> OpenAIError:
    hint = "" if include_all else " (requests the engine refused are retried only with `all`)"
    return OpenAIError(f"Batch {batch_id} has no failed request to retry{hint}.", param="batch_id")
