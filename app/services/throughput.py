"""A batch's throughput over time, from when its result chunks were recorded.

The finalizer stores the series on the batch (its chunks go); the dashboard reads it from the
chunks while the batch runs.
"""

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import ResultChunk, Shard

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
