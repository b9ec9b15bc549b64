"""OpenAI's enqueued limits: prompt tokens and requests a project may have queued per model.

A batch enqueues its requests and their prompt tokens from the moment validation admits it
until each of its shards is done (or the batch ends): the limit is released shard by shard as
work finishes. Admission happens in validation's closing transaction, after the project's row
is locked (`SELECT … FOR UPDATE` on PostgreSQL; SQLite's transactions are `BEGIN IMMEDIATE`),
so concurrent validations of one project are serialized and exactly the allowed batches get in.

Prompt tokens are estimated, not tokenized: the API serves models it has no tokenizer for,
and a tokenizer reads ~1.3 MB/s where validation streams ~350 MB/s (README, *Enqueued limits*).
"""

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES, ShardStatus
from app.db.models import Batch, Project, Shard
from app.schemas.batches import BatchError

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
    token_limit, request_limit = settings.enqueued_limits(model)
    if token_limit is None and request_limit is None:
        return None
    project = session.scalar(
        select(Project.name).where(Project.id == batch.project_id).with_for_update()
    )
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
