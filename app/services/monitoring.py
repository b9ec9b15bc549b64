"""Read-only views over the whole deployment, for operators: the dashboard and `/metrics`.

Counts follow the batch contract: while a batch runs, its progress is the sum over its
shards (what has been persisted); once terminal, the batch row's own totals.
"""

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import ColumnElement, Select, Text, case, cast, func, or_, select
from sqlalchemy.orm import Session

from app.core.progress import Outcomes, Progress
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus, ShardStatus
from app.core.throughput import Throughput, batch_throughput, running_seconds
from app.db.models import Batch, File, Project, RegisteredWorker, Shard
from app.schemas.admin import ProjectObject, WorkerObject, WorkerState
from app.schemas.batches import BatchObject
from app.services import batches
from app.services.schedule import to_project_object


@dataclass
class BatchView:
    """A batch as the API shows it (live counts), with what operators also want to see."""

    batch: Batch
    wire: BatchObject
    project_name: str

    @property
    def outcomes(self) -> Outcomes:
        c = self.wire.request_counts
        return Outcomes.of_counts(c.completed, c.failed, c.cancelled, c.expired)

    @property
    def done(self) -> int:
        return self.wire.request_counts.completed + self.wire.request_counts.failed

    def throughput(self, now: float) -> Throughput:
        usage = self.wire.usage
        return batch_throughput(
            self.batch,
            now,
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            completed=self.wire.request_counts.completed,
        )

    def eta_seconds(self, now: float) -> float | None:
        """Time left at the average request rate so far; None when unknown or finished."""
        if self.batch.status != BatchStatus.IN_PROGRESS or not self.done:
            return None
        rate = self.done / max(running_seconds(self.batch, now), 1e-9)
        return max(self.wire.request_counts.total - self.done, 0) / rate


@dataclass
class WorkerView:
    worker: RegisteredWorker
    batch_id: str | None
    shard_index: int | None
    state: WorkerState
    heartbeat_age: float

    def wire(self) -> WorkerObject:
        w = self.worker
        return WorkerObject(
            id=w.id,
            host=w.host,
            pid=w.pid,
            model=w.model,
            state=self.state,
            started_at=w.started_at,
            heartbeat_at=w.heartbeat_at,
            heartbeat_age_seconds=round(self.heartbeat_age, 3),
            current_batch_id=self.batch_id,
            current_shard_index=self.shard_index,
            tokens_per_second=w.tokens_per_second,
            stopped_at=w.stopped_at,
        )


@dataclass
class Totals:
    """Deployment-wide sums, for Prometheus; per model, `""` for a batch with none yet."""

    batches_by_status: dict[str, int] = field(default_factory=dict)
    # The same by (api, status): Message Batches (`anthropic`) apart from OpenAI batches.
    batches_by_api_status: dict[tuple[str, str], int] = field(default_factory=dict)
    # Requests of in-progress batches still to run, by the batch's model.
    queued_by_model: dict[str, int] = field(default_factory=dict)
    # Requests and tokens with a persisted result.
    done_by_model: dict[str, Progress] = field(default_factory=dict)


@dataclass
class Durations:
    """A histogram of batch durations: counts at or under each bound, cumulative."""

    bounds: tuple[float, ...]
    at_most: list[int]
    count: int
    total_seconds: float


DURATION_BOUNDS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 21600.0, 86400.0)


def _views(session: Session, rows: Sequence[Any]) -> list[BatchView]:
    running = [b.id for b, _ in rows if b.status not in TERMINAL_BATCH_STATUSES]
    live = batches.live_progress(session, running)
    return [BatchView(b, batches.to_wire(b, live.get(b.id, Progress())), name) for b, name in rows]


@dataclass(frozen=True)
class BatchFilter:
    """What the batch list is narrowed to; `search` matches a batch id or a metadata value."""

    status: str | None = None
    project_id: str | None = None
    search: str | None = None
    created_from: int | None = None  # unix seconds, inclusive
    created_before: int | None = None  # unix seconds, exclusive
    after: str | None = None  # a batch id: list the ones older than it (the API's `after`)


@dataclass
class BatchPage:
    views: list[BatchView]
    next_after: str | None  # the cursor of the next (older) page; None on the last page


def list_batches(session: Session, where: BatchFilter, *, limit: int = 100) -> BatchPage:
    """Newest first, across every project, a page of `limit` from the cursor on."""
    query = _filtered(where).order_by(Batch.seq.desc()).limit(limit + 1)
    rows = session.execute(query).all()
    more = len(rows) > limit
    views = _views(session, rows[:limit])
    return BatchPage(views, views[-1].batch.id if more and views else None)


def _filtered(where: BatchFilter) -> Select[Batch, str]:
    query = select(Batch, Project.name).join(Project, Project.id == Batch.project_id)
    if where.status:
        query = query.where(Batch.status == where.status)
    if where.project_id:
        query = query.where(Batch.project_id == where.project_id)
    if where.created_from is not None:
        query = query.where(Batch.created_at >= where.created_from)
    if where.created_before is not None:
        query = query.where(Batch.created_at < where.created_before)
    if where.after:
        older = select(Batch.seq).where(Batch.id == where.after).scalar_subquery()
        query = query.where(Batch.seq < older)
    if where.search:
        # Metadata is stored as SQLAlchemy's `json.dumps` text (SQLite's JSON, PostgreSQL's
        # `json`): the search text, encoded the same way, matches inside it (ASCII letters
        # in any case; others are `\\u` escapes there).
        encoded = json.dumps(where.search)[1:-1]
        pattern = f"%{_escape_like(encoded)}%"
        metadata = cast(Batch.metadata_, Text)
        query = query.where(or_(Batch.id == where.search, metadata.ilike(pattern, escape="\\")))
    return query


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def batches_to_scan(session: Session, where: BatchFilter, limit: int) -> list[tuple[str, File]]:
    """Batches that ran (so their input passed validation), newest first, with the input file."""
    query = (
        _filtered(where)
        .add_columns(File)
        .join(File, File.id == Batch.input_file_id)
        .where(Batch.in_progress_at.is_not(None))
        .order_by(Batch.seq.desc())
        .limit(limit)
    )
    return [(b.id, f) for b, _name, f in session.execute(query)]


def batch_views(session: Session, batch_ids: Sequence[str]) -> list[BatchView]:
    """The batches among `batch_ids`, in that order."""
    rows = session.execute(
        select(Batch, Project.name)
        .join(Project, Project.id == Batch.project_id)
        .where(Batch.id.in_(batch_ids))
    ).all()
    order = {batch_id: i for i, batch_id in enumerate(batch_ids)}
    return _views(session, sorted(rows, key=lambda row: order[row[0].id]))


def get_batch(session: Session, batch_id: str) -> BatchView | None:
    row = session.execute(
        select(Batch, Project.name)
        .join(Project, Project.id == Batch.project_id)
        .where(Batch.id == batch_id)
    ).first()
    return _views(session, [row])[0] if row is not None else None


def running_batches(session: Session) -> list[BatchView]:
    """Batches that started running and have not ended."""
    rows = session.execute(
        select(Batch, Project.name)
        .join(Project, Project.id == Batch.project_id)
        .where(Batch.in_progress_at.is_not(None), Batch.status.not_in(TERMINAL_BATCH_STATUSES))
        .order_by(Batch.seq)
    ).all()
    return _views(session, rows)


def _workers_query() -> Select[RegisteredWorker, str, int]:
    return select(RegisteredWorker, Shard.batch_id, Shard.index).outerjoin(
        Shard, Shard.id == RegisteredWorker.current_shard_id
    )


def _worker_view(row: Any, now: float, lease_seconds: float) -> WorkerView:
    worker, batch_id, shard_index = row
    age = max(now - worker.heartbeat_at, 0.0)
    if worker.stopped_at is not None:
        state = WorkerState.STOPPED
    elif age > lease_seconds:
        state = WorkerState.STALE
    elif worker.ready_at is None:
        state = WorkerState.LOADING
    elif worker.current_shard_id is not None:
        state = WorkerState.RUNNING
    else:
        state = WorkerState.IDLE
    return WorkerView(worker, batch_id, shard_index, state, age)


def list_workers(session: Session, lease_seconds: float, limit: int = 200) -> list[WorkerView]:
    """Live workers first, then the most recently seen."""
    now = time.time()
    rows = session.execute(
        _workers_query()
        .order_by(RegisteredWorker.stopped_at.is_not(None), RegisteredWorker.heartbeat_at.desc())
        .limit(limit)
    ).all()
    return [_worker_view(row, now, lease_seconds) for row in rows]


def get_worker(session: Session, worker_id: str, lease_seconds: float) -> WorkerView | None:
    row = session.execute(_workers_query().where(RegisteredWorker.id == worker_id)).first()
    return None if row is None else _worker_view(row, time.time(), lease_seconds)


def recent_shards(session: Session, worker_id: str, limit: int = 20) -> Sequence[Shard]:
    """The shards this worker claimed last, newest heartbeat first."""
    return session.scalars(
        select(Shard)
        .where(Shard.last_owner == worker_id)
        .order_by(Shard.heartbeat_at.desc())
        .limit(limit)
    ).all()


def list_files(
    session: Session,
    *,
    project_id: str | None = None,
    purpose: str | None = None,
    limit: int = 200,
) -> list[tuple[File, str]]:
    """Files that are not deleted, newest first, with their project's name."""
    query = (
        select(File, Project.name)
        .join(Project, Project.id == File.project_id)
        .where(
            File.deleted_at.is_(None),
            or_(File.expires_at.is_(None), File.expires_at > int(time.time())),
        )
    )
    if project_id:
        query = query.where(File.project_id == project_id)
    if purpose:
        query = query.where(File.purpose == purpose)
    return [(f, name) for f, name in session.execute(query.order_by(File.seq.desc()).limit(limit))]


def list_projects(session: Session) -> Sequence[Project]:
    return session.scalars(select(Project).order_by(Project.name)).all()


def project_objects(session: Session) -> list[ProjectObject]:
    return [to_project_object(p) for p in list_projects(session)]


def files_by_id(session: Session, file_ids: Sequence[str | None]) -> dict[str, File]:
    """The files among `file_ids` (deleted or not), by id."""
    ids = [i for i in file_ids if i]
    return {f.id: f for f in session.scalars(select(File).where(File.id.in_(ids)))}


def file_owner(session: Session, file_id: str) -> str | None:
    """The project a file (deleted or not) belongs to."""
    return session.scalar(select(File.project_id).where(File.id == file_id))


def totals(session: Session) -> Totals:
    """Batches by status, queued requests, and requests and tokens processed so far."""
    t = Totals()
    by_api = select(Batch.api, Batch.status, func.count()).group_by(Batch.api, Batch.status)
    for api, status, count in session.execute(by_api):
        t.batches_by_api_status[(api, status)] = int(count)
        t.batches_by_status[status] = t.batches_by_status.get(status, 0) + int(count)
    sums = (
        func.sum(Batch.completed),
        func.sum(Batch.failed),
        func.sum(Batch.input_tokens),
        func.sum(Batch.output_tokens),
        func.sum(Batch.cached_tokens),
    )
    for model, *done in session.execute(
        select(Batch.model, *sums)
        .where(Batch.status.in_(TERMINAL_BATCH_STATUSES))
        .group_by(Batch.model)
    ):
        _add(t, model, done)
    live = session.execute(
        select(
            Batch.model,
            func.sum(Shard.completed),
            func.sum(Shard.failed),
            func.sum(Shard.input_tokens),
            func.sum(Shard.output_tokens),
            func.sum(Shard.cached_tokens),
            func.sum(
                # Lines still to run in shards that can still be run.
                Shard.line_count - Shard.completed - Shard.failed
            ).filter(Batch.status == BatchStatus.IN_PROGRESS, Shard.status != ShardStatus.DONE),
        )
        .join(Batch, Batch.id == Shard.batch_id)
        .where(Batch.status.not_in(TERMINAL_BATCH_STATUSES))
        .group_by(Batch.model)
    )
    for model, *done, queued in live:
        _add(t, model, done)
        if queued:
            t.queued_by_model[model or ""] = t.queued_by_model.get(model or "", 0) + int(queued)
    return t


def _add(t: Totals, model: str | None, sums: Sequence[Any]) -> None:
    p = t.done_by_model.setdefault(model or "", Progress())
    for name, value in zip(
        ("completed", "failed", "input_tokens", "output_tokens", "cached_tokens"), sums, strict=True
    ):
        setattr(p, name, getattr(p, name) + int(value or 0))


def batch_durations(session: Session) -> dict[str, Durations]:
    """Per model, how long ended batches took from creation to their end."""
    end = func.coalesce(Batch.completed_at, Batch.cancelled_at, Batch.expired_at, Batch.failed_at)
    return _histograms(session, end - Batch.created_at, end.is_not(None))


def queue_waits(session: Session) -> dict[str, Durations]:
    """Per model, how long batches waited from creation to `in_progress`."""
    started = Batch.in_progress_at.is_not(None)
    return _histograms(session, Batch.in_progress_at - Batch.created_at, started)


def _histograms(
    session: Session, seconds: ColumnElement[Any], where: ColumnElement[bool]
) -> dict[str, Durations]:
    under = [func.sum(case((seconds <= bound, 1), else_=0)) for bound in DURATION_BOUNDS]
    rows = session.execute(
        select(Batch.model, func.count(), func.sum(seconds), *under)
        .where(where)
        .group_by(Batch.model)
    )
    return {
        model or "": Durations(
            DURATION_BOUNDS, [int(n or 0) for n in at_most], int(count), float(total or 0)
        )
        for model, count, total, *at_most in rows
    }
