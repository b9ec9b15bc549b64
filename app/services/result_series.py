"""A batch's throughput over time, from when its result chunks were recorded.

The finalizer stores the series on the batch (its chunks go); the dashboard reads it from the
chunks while the batch runs. `recent_results` adds both up over a recent window: the
deployment's series on the dashboard, and the planner's measure of each model's speed.
"""

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, BatchSchedule, ResultChunk, Shard

CHART_POINTS = 60


def throughput_series(session: Session, batch_id: str) -> list[tuple[float, float]]:
    """Requests finished per second over time, from when result chunks were recorded.

    At most `CHART_POINTS` points of `(unix time, requests/s)`, evenly spaced.
    """
    chunks = session.execute(
        select(ResultChunk.created_at, ResultChunk.lines)
        .join(Shard, Shard.id == ResultChunk.shard_id)
        .where(Shard.batch_id == batch_id)
        .order_by(ResultChunk.created_at)
    ).all()
    if not chunks:
        return []
    start, end = chunks[0][0], chunks[-1][0]
    width = max((end - start) / CHART_POINTS, 1.0)
    buckets = [0] * (int((end - start) / width) + 1)
    for created_at, lines in chunks:
        buckets[int((created_at - start) / width)] += lines
    return [(start + i * width, count / width) for i, count in enumerate(buckets)]


@dataclass(frozen=True)
class Finished:
    """Results finished on `model` at about `at`: `requests` of them, worth `work`."""

    model: str | None
    at: float
    requests: float
    work: float


def recent_results(session: Session, since: float) -> Iterator[Finished]:
    """Every result finished since `since`, whether its batch still runs or has ended.

    Running batches count from their chunks; a batch that ended counts from the series kept on
    it (its chunks were deleted when it ended), each point's work at the batch's work per
    request.
    """
    live = (
        select(Batch.model, ResultChunk.created_at, ResultChunk.lines, ResultChunk.work)
        .join(Shard, Shard.id == ResultChunk.shard_id)
        .join(Batch, Batch.id == Shard.batch_id)
        .where(Batch.status.not_in(TERMINAL_BATCH_STATUSES), ResultChunk.created_at >= since)
    )
    for model, created_at, lines, work in session.execute(live).yield_per(1000):
        yield Finished(model, created_at, lines, work or 0)
    end = func.coalesce(Batch.completed_at, Batch.cancelled_at, Batch.expired_at, Batch.failed_at)
    work_done = func.coalesce(BatchSchedule.work_done, 0)
    ended = (
        select(Batch.model, Batch.throughput, work_done, Batch.completed + Batch.failed)
        .outerjoin(BatchSchedule, BatchSchedule.batch_id == Batch.id)
        .where(
            Batch.status.in_(TERMINAL_BATCH_STATUSES), Batch.throughput.is_not(None), end >= since
        )
    )
    for model, series, work_done, done in session.execute(ended).yield_per(100):
        per_request = work_done / done if done else 0.0
        for at, requests in _requests_at(series):
            if at >= since:
                yield Finished(model, at, requests, requests * per_request)


def deployment_series(
    session: Session, since: float, until: float, points: int = CHART_POINTS
) -> list[tuple[float, float]]:
    """Requests finished per second across every batch, in `points` buckets of `[since, until)`."""
    width = max((until - since) / points, 1e-9)
    counts = [0.0] * points
    for result in recent_results(session, since):
        if result.at < until:
            counts[min(int((result.at - since) / width), points - 1)] += result.requests
    return [(since + i * width, n / width) for i, n in enumerate(counts)]


def _requests_at(series: Sequence[Any]) -> Iterable[tuple[float, float]]:
    """A kept series' points as `(time, requests)`: each rate times its bucket's width."""
    width = float(series[1][0] - series[0][0]) if len(series) > 1 else 1.0
    return ((float(at), float(rate) * width) for at, rate in series)
