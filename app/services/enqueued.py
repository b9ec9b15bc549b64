"""OpenAI's enqueued limits: prompt tokens and requests a project may have queued per model.

A batch enqueues its requests and their prompt tokens from the moment validation admits it
until each of its shards is done (or the batch ends): the limit is released shard by shard as
work finishes. Admission happens in validation's closing transaction, after the project's row
is locked (`SELECT … FOR UPDATE` on PostgreSQL; SQLite's transactions are `BEGIN IMMEDIATE`),
so concurrent validations of one project are serialized and exactly the allowed batches get in.

The limits are the settings' (per model, the same for every project) unless an admin gave the
project its own on that model (`project_limits`, `POST /v1/admin/projects/{p}/limits`): OpenAI's
limits are an organization's, so one tenant may be allowed more or less than the others.

Prompt tokens are estimated, not tokenized: the API serves models it has no tokenizer for,
and a tokenizer reads ~1.3 MB/s where validation streams ~350 MB/s (README, *Enqueued limits*).
"""

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES, ShardStatus
from app.db import upsert
from app.db.models import Batch, Project, ProjectLimit, Shard
from app.schemas.admin import EnqueuedLimitsObject, UpdateEnqueuedLimitsRequest
from app.schemas.batches import BatchError
from app.services.auth import find_project, lock_project

# Fields of a request body that hold its prompt, across the served endpoints.
_PROMPT_FIELDS = (
    "messages",
    "prompt",
    "input",
    "instructions",
    "text_1",
    "text_2",
    "query",
    "documents",
)
CHARS_PER_TOKEN = 4
# What a chat template adds around each message (role markers, separators).
TOKENS_PER_MESSAGE = 4
_RETRY = "Please try again once some in_progress batches have been completed."


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """About how many prompt tokens a request body carries: text / 4, token ids as given."""
    tokens = sum(_tokens(body.get(name)) for name in _PROMPT_FIELDS)
    messages = body.get("messages")
    if isinstance(messages, list):
        tokens += TOKENS_PER_MESSAGE * len(messages)
    return tokens


def _tokens(value: object) -> int:
    if isinstance(value, str):
        return -(-len(value) // CHARS_PER_TOKEN)
    if isinstance(value, bool) or value is None:
        return 0
    if isinstance(value, int):
        return 1  # a token id
    if isinstance(value, list):
        return sum(_tokens(v) for v in value)
    if isinstance(value, dict):
        return sum(_tokens(v) for v in value.values())
    return 0


def admit(
    session: Session, settings: Settings, batch: Batch, model: str, requests: int, tokens: int
) -> BatchError | None:
    """None if the batch fits under its project's limits for `model`, else why it does not."""
    token_limit, request_limit = limits(session, settings, batch.project_id, model)
    if token_limit is None and request_limit is None:
        return None
    project = lock_project(session, batch.project_id)
    queued_tokens, queued_requests = enqueued(session, batch.project_id, model)
    if token_limit is not None and queued_tokens + tokens > token_limit:
        return BatchError(
            code="token_limit_exceeded",
            message=f"Enqueued token limit reached for {model} in organization {project}. "
            f"Limit: {token_limit:,} enqueued tokens. {_RETRY}",
        )
    if request_limit is not None and queued_requests + requests > request_limit:
        return BatchError(
            code="request_limit_exceeded",
            message=f"Enqueued request limit reached for {model} in organization {project}. "
            f"Limit: {request_limit:,} enqueued requests. {_RETRY}",
        )
    return None


def limits(
    session: Session, settings: Settings, project_id: str, model: str
) -> tuple[int | None, int | None]:
    """The project's (tokens, requests) limits on `model`; None: unlimited."""
    return _limits(settings, model, session.get(ProjectLimit, (project_id, model)))


def _limits(
    settings: Settings, model: str, own: ProjectLimit | None
) -> tuple[int | None, int | None]:
    tokens, requests = settings.enqueued_limits(model)
    if own is None:
        return tokens, requests
    return (
        tokens if own.token_limit is None else own.token_limit,
        requests if own.request_limit is None else own.request_limit,
    )


def _limits_object(
    settings: Settings, project: Project, model: str, own: ProjectLimit | None
) -> EnqueuedLimitsObject:
    tokens, requests = _limits(settings, model, own)
    return EnqueuedLimitsObject(
        project_id=project.id,
        project_name=project.name,
        model=model,
        token_limit=tokens,
        request_limit=requests,
        token_limit_override=own.token_limit if own else None,
        request_limit_override=own.request_limit if own else None,
    )


def limit_objects(
    session: Session, settings: Settings, name_or_id: str
) -> list[EnqueuedLimitsObject]:
    """A project's limits on every served model and every model it has its own limits for."""
    project = find_project(session, name_or_id)
    own = {
        row.model: row
        for row in session.scalars(
            select(ProjectLimit).where(ProjectLimit.project_id == project.id)
        )
    }
    models = {m.name for m in settings.models} | own.keys()
    models |= settings.enqueued_token_limits.keys() | settings.enqueued_request_limits.keys()
    return [_limits_object(settings, project, m, own.get(m)) for m in sorted(models)]


def overridden(session: Session, settings: Settings) -> list[EnqueuedLimitsObject]:
    """Every project's limits on each model it has its own limits for (the dashboard's list)."""
    rows = session.execute(
        select(Project, ProjectLimit)
        .join(ProjectLimit, ProjectLimit.project_id == Project.id)
        .order_by(Project.name, ProjectLimit.model)
    ).all()
    return [_limits_object(settings, project, own.model, own) for project, own in rows]


def set_limits(
    session: Session, settings: Settings, name_or_id: str, change: UpdateEnqueuedLimitsRequest
) -> EnqueuedLimitsObject:
    """Sets the fields `change` carries (null: back to the default); the model's limits after.

    Batches already admitted stay; the next validation of the project counts against these.
    """
    project = find_project(session, name_or_id)
    fields = {f: getattr(change, f) for f in ("token_limit", "request_limit")}
    values = {f: v for f, v in fields.items() if f in change.model_fields_set}
    key = {"project_id": project.id, "model": change.model}
    if values:
        session.execute(
            upsert.insert(session, ProjectLimit)
            .values(**key, **fields)
            .on_conflict_do_update(index_elements=list(key), set_=values)
        )
    own = session.get(ProjectLimit, (project.id, change.model), populate_existing=True)
    if own is not None and own.token_limit is None and own.request_limit is None:
        session.delete(own)
        own = None
    return _limits_object(settings, project, change.model, own)


def enqueued(session: Session, project_id: str, model: str) -> tuple[int, int]:
    """(prompt tokens, requests) the project has enqueued for `model`: its unfinished shards."""
    row = session.execute(
        select(func.sum(Shard.prompt_tokens), func.sum(Shard.line_count))
        .join(Batch, Batch.id == Shard.batch_id)
        .where(
            Batch.project_id == project_id,
            Batch.model == model,
            Batch.status.not_in(TERMINAL_BATCH_STATUSES),
            Shard.status != ShardStatus.DONE,
        )
    ).one()
    return int(row[0] or 0), int(row[1] or 0)
