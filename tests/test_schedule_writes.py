"""The schedule's writers leave the `batches` row alone: a checkpoint writes its shard, the
batch's schedule row and the project's share; the planner writes schedule rows only.

Seen two ways: the statements each one sends (no `UPDATE`/`INSERT`/`DELETE` of `batches`, on
SQLite and PostgreSQL), and on PostgreSQL the batch row's version (`xmin`, which any write of
the row changes) before and after.
"""

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, select, text, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import ShardLease
from app.core.progress import Progress
from app.core.schedule import Order
from app.core.states import BatchStatus
from app.db.models import BatchSchedule, ProjectShare, ResultChunk
from app.db.session import engine_for, session_scope
from app.services import schedule
from tests.batch_sim import admitted_batch
from tests.fake_engine import MODEL
from worker import claim

WRITE = re.compile(r"^\s*(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+\"?(\w+)", re.IGNORECASE)


@contextmanager
def tables_written(settings: Settings) -> Iterator[list[str]]:
    """The tables written by the statements sent meanwhile, in order."""
    written: list[str] = []

    def seen(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        if found := WRITE.match(statement):
            written.append(found.group(2).lower())

    engine = engine_for(settings.sqlalchemy_url)
    event.listen(engine, "before_cursor_execute", seen)
    try:
        yield written
    finally:
        event.remove(engine, "before_cursor_execute", seen)


def _row_version(session: Session, batch_id: str) -> int | None:
    """PostgreSQL's version of the batch row (a write makes a new one); None on SQLite."""
    if session.get_bind().dialect.name != "postgresql":
        return None
    return int(
        session.scalar(text("SELECT xmin::text FROM batches WHERE id = :id"), {"id": batch_id})
    )


def _checkpoint(settings: Settings, lease: ShardLease, sequence: int, done: bool) -> None:
    with session_scope(settings) as session:
        state = claim.checkpoint(
            session,
            lease,
            chunk=(sequence, f"chunk-{lease.shard_id}-{sequence}", 1),
            progress=Progress(completed=1, output_tokens=10),
            done=done,
        )
    assert state is not None and state.status == BatchStatus.IN_PROGRESS


def _work(settings: Settings, batch_id: str) -> tuple[int, int]:
    """The batch's work served, and its project's, on the schedule's rows."""
    with session_scope(settings) as session:
        own = session.get_one(BatchSchedule, batch_id).work_done
        share = session.scalar(select(ProjectShare.work_done).where(ProjectShare.model == MODEL))
        return own, share or 0


def test_a_checkpoint_writes_the_schedule_not_the_batch(settings: Settings) -> None:
    batch_id = admitted_batch(settings, "alpha", 2)
    with session_scope(settings) as session:
        lease = claim.claim_shard(session, "w", [MODEL], 30.0, Order.FAIR)
        version = _row_version(session, batch_id)
    assert lease is not None and lease.batch_id == batch_id
    with tables_written(settings) as written:
        _checkpoint(settings, lease, 0, done=False)  # a running shard's checkpoint
        _checkpoint(settings, lease, 1, done=True)  # the one that closes it
    assert "batches" not in written, written
    assert {"shards", "result_chunks", "batch_schedules", "project_shares"} <= set(written)
    assert _work(settings, batch_id) == (20, 20)
    with session_scope(settings) as session:
        assert _row_version(session, batch_id) == version


def test_the_planner_writes_schedule_rows_only(settings: Settings) -> None:
    batch_id = admitted_batch(settings, "alpha", 4)
    for sequence in range(2):
        with session_scope(settings) as session:
            lease = claim.claim_shard(session, "w", [MODEL], 30.0, Order.FAIR)
        assert lease is not None
        _checkpoint(settings, lease, sequence, done=True)
    now = time.time()
    with session_scope(settings) as session:  # two results a second apart: a known speed
        for back, chunk_id in enumerate(session.scalars(select(ResultChunk.id))):
            chunk = update(ResultChunk).where(ResultChunk.id == chunk_id)
            session.execute(chunk.values(created_at=now - 2 + back))
        version = _row_version(session, batch_id)
    with tables_written(settings) as written, session_scope(settings) as session:
        estimates = schedule.replan(session, Order.FAIR, now)
    assert [e.batch_id for e in estimates] == [batch_id]
    assert written and set(written) == {"batch_schedules"}, written
    with session_scope(settings) as session:
        plan = session.get_one(BatchSchedule, batch_id)
        assert plan.eta_finish_at == pytest.approx(estimates[0].finish_at)
        assert plan.eta_made_at is not None
        assert _row_version(session, batch_id) == version
