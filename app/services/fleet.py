"""The deployment at a glance: work queued per model, workers by state, tokens today per project."""

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.db.models import Batch, Project, Shard
from app.schemas.admin import WorkerState
from app.services import monitoring

SERVING_STATES = (WorkerState.IDLE, WorkerState.RUNNING)


@dataclass
class ModelQueue:
    model: str
    queued_requests: int = 0  # lines still to run in batches that are in progress
    running_batches: int = 0
    validating_batches: int = 0
    workers: Counter[WorkerState] = field(default_factory=Counter)


@dataclass
class ProjectTokens:
    project: str
    batches: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass
class Fleet:
    models: list[ModelQueue]
    workers: Counter[WorkerState]
    tokens_today: list[ProjectTokens]
    tokens_per_second: float  # what the workers last reported, summed


def day_start(now: float) -> int:
    """00:00 UTC of the day `now` falls in."""
    day = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    return int(day.timestamp())


def fleet(
    session: Session,
    totals: monitoring.Totals,
    workers: list[monitoring.WorkerView],
    today: int,
) -> Fleet:
    """The fleet from figures already read (`app.services.stats`), plus batch counts."""
    queues: dict[str, ModelQueue] = {}

    def queue(model: str | None) -> ModelQueue:
        return queues.setdefault(model or "", ModelQueue(model or ""))

    for name, queued in totals.queued_by_model.items():
        queue(name).queued_requests = queued
    counts = select(Batch.model, Batch.status, func.count()).group_by(Batch.model, Batch.status)
    for model, status, n in session.execute(
        counts.where(Batch.status.in_((BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)))
    ):
        q = queue(model)
        if status == BatchStatus.VALIDATING:
            q.validating_batches = int(n)
        else:
            q.running_batches = int(n)
    states: Counter[WorkerState] = Counter()
    rate = 0.0
    for view in workers:
        if view.state == WorkerState.STOPPED:
            continue
        states[view.state] += 1
        queue(view.worker.model).workers[view.state] += 1
        if view.state in SERVING_STATES:
            rate += view.worker.tokens_per_second
    return Fleet(
        sorted(queues.values(), key=lambda q: q.model),
        states,
        tokens_today(session, today),
        rate,
    )


def tokens_today(session: Session, since: int) -> list[ProjectTokens]:
    """Per project: batches that ended since `since`, and those still running, so far."""
    found: dict[str, ProjectTokens] = {}
    end = func.coalesce(Batch.completed_at, Batch.cancelled_at, Batch.expired_at, Batch.failed_at)
    ended = (
        select(
            Project.name,
            func.count(),
            func.sum(Batch.input_tokens),
            func.sum(Batch.output_tokens),
        )
        .join(Project, Project.id == Batch.project_id)
        .where(Batch.status.in_(TERMINAL_BATCH_STATUSES), end >= since)
        .group_by(Project.name)
    )
    running = (
        select(
            Project.name,
            func.count(func.distinct(Batch.id)),
            func.sum(Shard.input_tokens),
            func.sum(Shard.output_tokens),
        )
        .join(Batch, Batch.id == Shard.batch_id)
        .join(Project, Project.id == Batch.project_id)
        .where(Batch.status.not_in(TERMINAL_BATCH_STATUSES))
        .group_by(Project.name)
    )
    for query in (ended, running):
        for name, batches, input_tokens, output_tokens in session.execute(query):
            p = found.setdefault(name, ProjectTokens(name))
            p.batches += int(batches)
            p.input_tokens += int(input_tokens or 0)
            p.output_tokens += int(output_tokens or 0)
    return sorted(found.values(), key=lambda p: (-(p.input_tokens + p.output_tokens), p.project))
