"""Objects lost from the store, and batch steps that keep failing: explicit outcomes, never a
batch that cannot end.

Scripted sequences on the worker's own shard and checkpoint code (`ShardRun`, a scripted
engine) and the finalizer, on both databases. A lost reply is made with SQLAlchemy events: the
COMMIT goes through, then the caller sees the connection drop.
"""

import asyncio
import time
from collections.abc import Callable
from typing import Any, Literal

import pytest
from sqlalchemy import event, func, select, update
from sqlalchemy.engine import ExceptionContext
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, UOWTransaction

from app.config import Settings
from app.core.chunks import decode_chunk
from app.core.leases import ShardLease
from app.core.states import ShardOutcome
from app.db.models import Batch, ResultChunk, Shard
from app.db.session import engine_for, session_scope
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.steps import batch_lease, finalization
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.storage import storage_of
from tests import batch_sim as sim
from tests.engine_fixtures import chat_line, jsonl
from tests.fake_engine import MODEL, FakeEngine
from tests.test_finalizer import lines_of
from worker import claim
from worker.engine_results import EngineResult
from worker.scheduler import Scheduler
from worker.shard import RunOptions, ShardRun

FAST, SLOW = 0.0, 2.0


class SlowUntilStopped(FakeEngine):
    """FakeEngine, but a SLOW line answers only when its run stops it: a test that stops a
    run once some lines are recorded must not depend on how soon that is (on a busy machine,
    the SLOW lines had ended first)."""

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        held = {**body, "delay": 3600.0} if body.get("delay") == SLOW else body
        return await super().run(endpoint, held, request_id)


@pytest.fixture
def db(settings: Settings) -> Settings:
    return settings.model_copy(update={"shard_lines": 100, "lease_seconds": 30.0})


def start(settings: Settings, data: bytes) -> str:
    """A validated (`in_progress`) batch of these requests."""
    file_id = sim.store_input_file(settings, data)
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint=sim.CHAT, completion_window="24h"
        )
        batch_id = batches.create_batch(session, settings, project_id, params).id
    validate_pending(settings, "validator")
    assert sim.load_batch(settings, batch_id).status == "in_progress"
    return batch_id


def new_batch(settings: Settings, delays: list[float]) -> tuple[str, list[str]]:
    """A batch of one shard, a request per delay (the scripted engine's answer time);
    returns its id and custom_ids."""
    ids = [f"r{i}" for i in range(len(delays))]
    data = jsonl([chat_line(cid, delay=delay) for cid, delay in zip(ids, delays, strict=True)])
    return start(settings, data), ids


def ready_batch(settings: Settings) -> str:
    """A two-line batch, run to the end by the stand-in worker: ready to finalize."""
    batch_id = start(settings, sim.requests_file(2))
    sim.run_batch(settings, batch_id)
    return batch_id


def take_shard(settings: Settings, owner: str) -> ShardLease:
    with session_scope(settings) as session:
        lease = claim.claim_shard(session, owner, [MODEL], settings.lease_seconds)
    assert lease is not None
    return lease


def run_shard(
    settings: Settings,
    lease: ShardLease,
    engine: FakeEngine,
    stop_when: Callable[[ShardRun], bool] | None = None,
) -> tuple[ShardRun, ShardOutcome]:
    """Runs the shard as a worker does; `stop_when`: hand it back once that holds."""
    options = RunOptions(
        checkpoint_seconds=0.05, lease_seconds=settings.lease_seconds, drain_seconds=0.0
    )

    async def scenario() -> tuple[ShardRun, ShardOutcome]:
        scheduler = Scheduler(engine, 2 * engine.max_num_seqs)
        run = ShardRun(settings, storage_of(settings), scheduler, lease, options)
        task = asyncio.create_task(run.run())
        if stop_when is not None:
            while not task.done() and not stop_when(run):
                await asyncio.sleep(0.01)
            run.request_stop()
        return run, await task

    return asyncio.run(scenario())


def contents(engine: FakeEngine) -> list[str]:
    """The custom_ids the engine was asked to answer (`chat_line` says `hello <id>`)."""
    return sorted(body["messages"][0]["content"].removeprefix("hello ") for body in engine.bodies())


def chunk_keys(settings: Settings, shard_id: int) -> list[str]:
    with session_scope(settings) as session:
        return list(
            session.scalars(
                select(ResultChunk.storage_key)
                .where(ResultChunk.shard_id == shard_id)
                .order_by(ResultChunk.epoch, ResultChunk.sequence)
            )
        )


def ids_in(settings: Settings, keys: list[str]) -> set[str]:
    storage = storage_of(settings)
    return {
        output["custom_id"]
        for key in keys
        for _line, output in decode_chunk(b"".join(storage.read(key)))
    }


def shard_of(settings: Settings, shard_id: int) -> Shard:
    with session_scope(settings) as session:
        shard = session.get(Shard, shard_id)
        assert shard is not None
        session.expunge(shard)
        return shard


def assert_intact(settings: Settings, batch_id: str, custom_ids: list[str]) -> Batch:
    """Every custom_id exactly once across the files; the counts are the files'."""
    batch = sim.load_batch(settings, batch_id)
    output = lines_of(settings, batch.output_file_id)
    errors = lines_of(settings, batch.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(custom_ids)
    assert (batch.completed, batch.failed) == (len(output), len(errors))
    return batch


class LostReply:
    """The first commit that records a chunk goes through, then its caller sees the
    connection drop. Another worker takes the shard over right then (`commit`), or once the
    retry met the recorded row (`retry`: the checkpoint's `IntegrityError` branch)."""

    def __init__(self, settings: Settings, shard_id: int, when: Literal["commit", "retry"]):
        self.settings = settings
        self.shard_id = shard_id
        self.when = when
        self.chunk_key: str | None = None
        self.new_lease: ShardLease | None = None
        self._conflicted = False
        self._hooks: list[tuple[Any, str, Callable[..., None]]] = [
            (Session, "after_flush", self._flushed),
            (Session, "after_commit", self._committed),
            (Session, "after_rollback", self._rolled_back),
            (engine_for(settings.sqlalchemy_url), "handle_error", self._failed),
        ]

    def __enter__(self) -> "LostReply":
        for target, name, hook in self._hooks:
            event.listen(target, name, hook)
        return self

    def __exit__(self, *exc: object) -> None:
        for target, name, hook in self._hooks:
            event.remove(target, name, hook)

    def _flushed(self, session: Session, _flush: UOWTransaction) -> None:
        for obj in session.new:
            if isinstance(obj, ResultChunk):
                session.info["chunk"] = obj.storage_key

    def _committed(self, session: Session) -> None:
        key = session.info.pop("chunk", None)
        if key is None or self.chunk_key is not None:
            return
        self.chunk_key = key
        if self.when == "commit":
            self._take_over()
        raise OperationalError("COMMIT", None, ConnectionResetError("connection reset by peer"))

    def _failed(self, context: ExceptionContext) -> None:
        if isinstance(context.sqlalchemy_exception, IntegrityError):
            self._conflicted = True

    def _rolled_back(self, _session: Session) -> None:
        if self._conflicted and self.new_lease is None:
            self._take_over()

    def _take_over(self) -> None:
        """The lease lapses (as on a stalled worker) and another worker claims the shard."""
        with session_scope(self.settings) as session:
            session.execute(update(Shard).where(Shard.id == self.shard_id).values(heartbeat_at=0))
        self.new_lease = take_shard(self.settings, "w2")
        assert self.new_lease.shard_id == self.shard_id


@pytest.mark.parametrize("when", ["commit", "retry"])
def test_a_chunk_recorded_by_a_commit_whose_reply_was_lost_is_kept(
    db: Settings, when: Literal["commit", "retry"]
) -> None:
    batch_id, ids = new_batch(db, [FAST] * 3 + [SLOW] * 5)
    first = take_shard(db, "w1")
    with LostReply(db, first.shard_id, when) as fault:
        _run, outcome = run_shard(db, first, FakeEngine())
    assert outcome is ShardOutcome.LOST
    assert fault.chunk_key is not None and fault.new_lease is not None
    # The chunk's row is committed, so its object stays.
    assert chunk_keys(db, first.shard_id) == [fault.chunk_key]
    assert storage_of(db).exists(fault.chunk_key)
    recorded = ids_in(db, [fault.chunk_key])
    assert recorded

    engine = FakeEngine()
    run, outcome = run_shard(db, fault.new_lease, engine)
    assert (outcome, run.closed_batch) == (ShardOutcome.DONE, True)
    # The next holder runs only the lines without a recorded result.
    assert contents(engine) == sorted(set(ids) - recorded)
    assert finalize_ready_batches(db, "f") == 1
    assert assert_intact(db, batch_id, ids).status == "completed"


def test_a_chunk_deleted_behind_the_workers_back_runs_again(db: Settings) -> None:
    batch_id, ids = new_batch(db, [FAST] * 3 + [0.3] * 3 + [SLOW] * 2)
    first = take_shard(db, "w1")
    _run, outcome = run_shard(db, first, SlowUntilStopped(), stop_when=lambda r: r.recorded >= 6)
    assert outcome is ShardOutcome.RELEASED
    keys = chunk_keys(db, first.shard_id)
    lost, kept = keys[0], keys[1:]
    rerun = sorted(set(ids) - ids_in(db, kept))
    storage_of(db).delete(lost)

    engine = FakeEngine()
    second = take_shard(db, "w2")
    run, outcome = run_shard(db, second, engine)
    assert (outcome, run.closed_batch) == (ShardOutcome.DONE, True)
    assert contents(engine) == rerun
    assert lost not in chunk_keys(db, first.shard_id)
    # Counts were recomputed from the chunks that remained, not added to.
    shard = shard_of(db, first.shard_id)
    assert shard.completed + shard.failed == len(ids)
    assert finalize_ready_batches(db, "f") == 1
    assert assert_intact(db, batch_id, ids).status == "completed"


def test_a_chunk_lost_before_finalization_runs_again(db: Settings) -> None:
    batch_id, ids = new_batch(db, [FAST] * 6)
    first = take_shard(db, "w1")
    assert run_shard(db, first, FakeEngine())[1] is ShardOutcome.DONE
    lost = chunk_keys(db, first.shard_id)[0]
    lost_ids = ids_in(db, [lost])
    storage_of(db).delete(lost)

    # The finalizer drops the chunk's row and sends the shard back to run its lines.
    assert finalize_ready_batches(db, "f") == 0
    batch = sim.load_batch(db, batch_id)
    assert (batch.status, batch.finalizing_at) == ("in_progress", None)
    assert shard_of(db, first.shard_id).status == "pending"
    engine = FakeEngine()
    run, outcome = run_shard(db, take_shard(db, "w2"), engine)
    assert (outcome, run.closed_batch) == (ShardOutcome.DONE, True)
    assert contents(engine) == sorted(lost_ids)
    assert finalize_ready_batches(db, "f") == 1
    assert assert_intact(db, batch_id, ids).status == "completed"


def test_a_chunk_lost_in_a_cancelled_batch_ends_cancelled(db: Settings) -> None:
    batch_id, ids = new_batch(db, [FAST] * 3 + [SLOW] * 3)
    first = take_shard(db, "w1")
    run_shard(db, first, SlowUntilStopped(), stop_when=lambda r: r.recorded >= 3)
    [lost, *_] = chunk_keys(db, first.shard_id)
    lost_ids = ids_in(db, [lost])
    storage_of(db).delete(lost)
    with session_scope(db) as session:
        batches.cancel_batch(session, sim.load_batch(db, batch_id).project_id, batch_id)

    assert finalize_ready_batches(db, "f") == 0  # the lost chunk's row is dropped
    assert finalize_ready_batches(db, "f") == 1
    batch = assert_intact(db, batch_id, ids)
    assert batch.status == "cancelled"
    cancelled = {
        line["custom_id"]
        for line in lines_of(db, batch.error_file_id)
        if line["error"] and line["error"]["code"] == "batch_cancelled"
    }
    assert lost_ids <= cancelled and batch.cancelled == len(cancelled)


def _assert_failed_naming(settings: Settings, batch_id: str, key: str) -> None:
    batch = sim.load_batch(settings, batch_id)
    assert batch.status == "failed" and batch.failed_at is not None
    [error] = batch.errors or []
    assert error["code"] == "input_file_missing" and error["param"] == "input_file_id"
    assert key in error["message"] and batch.input_file_id in error["message"]


def test_an_input_file_lost_while_running_fails_the_batch(db: Settings) -> None:
    batch_id, _ids = new_batch(db, [FAST] * 4)
    lease = take_shard(db, "w1")
    storage_of(db).delete(lease.input_key)
    engine = FakeEngine()
    _run, outcome = run_shard(db, lease, engine)
    assert outcome is ShardOutcome.BATCH_ENDED and not engine.calls
    _assert_failed_naming(db, batch_id, lease.input_key)
    assert shard_of(db, lease.shard_id).lease_owner is None
    with session_scope(db) as session:
        assert claim.claim_shard(session, "w2", [MODEL], db.lease_seconds) is None


def test_an_input_file_lost_before_finalization_fails_the_batch(db: Settings) -> None:
    batch_id, _ids = new_batch(db, [FAST] * 4)
    lease = take_shard(db, "w1")
    assert run_shard(db, lease, FakeEngine())[1] is ShardOutcome.DONE
    storage_of(db).delete(lease.input_key)
    assert finalize_ready_batches(db, "f") == 1
    _assert_failed_naming(db, batch_id, lease.input_key)
    assert chunk_keys(db, lease.shard_id) == []
    assert finalize_ready_batches(db, "f") == 0


def test_failing_finalizations_back_off_and_never_hold_up_healthy_ones(
    db: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    poisoned = {ready_batch(db) for _ in range(60)}
    healthy = ready_batch(db)
    tried: list[str] = []
    original = finalization.finalize

    def finalize(settings: Settings, storage: Any, job: finalization.Finalization) -> bool:
        tried.append(job.lease.batch_id)
        if job.lease.batch_id in poisoned:
            raise RuntimeError("a chunk this version cannot read")
        return original(settings, storage, job)

    monkeypatch.setattr(finalization, "finalize", finalize)
    # Longer than the test runs on a loaded machine: no backoff ends unless the test says so.
    monkeypatch.setattr(batch_lease, "STEP_RETRY_SECONDS", (600.0, 3600.0))
    started = time.time()
    # Two passes at most: each poisoned batch is tried once, then waits out its backoff.
    passes = 0
    while sim.load_batch(db, healthy).status != "completed":
        passes += 1
        assert passes <= 2, "the healthy batch waited behind failing ones"
        finalize_ready_batches(db, "f")
    assert len(tried) == 61 and set(tried) == poisoned | {healthy}
    failures = _step_failures(db, poisoned)
    assert {f for f, _at in failures} == {1}
    assert all(at >= started + batch_lease.retry_delay(1) for _f, at in failures)

    tried.clear()
    assert finalize_ready_batches(db, "f") == 0 and tried == []  # all backing off
    # Their backoff over, they come after a batch that never failed, and wait twice as long.
    later = ready_batch(db)
    with session_scope(db) as session:
        session.execute(update(Batch).where(Batch.id.in_(poisoned)).values(step_retry_at=0))
    assert finalize_ready_batches(db, "f") == 1
    assert tried[0] == later and sim.load_batch(db, later).status == "completed"
    again = [f for f, _at in _step_failures(db, poisoned) if f == 2]
    assert len(again) == len(tried) - 1  # each failed twice now: its next wait doubles
    assert batch_lease.retry_delay(2) == 2 * batch_lease.retry_delay(1)
    assert batch_lease.retry_delay(100) == batch_lease.STEP_RETRY_SECONDS[1]


def _step_failures(settings: Settings, batch_ids: set[str]) -> list[tuple[int, float]]:
    with session_scope(settings) as session:
        rows = session.execute(
            select(Batch.step_failures, func.coalesce(Batch.step_retry_at, 0.0)).where(
                Batch.id.in_(batch_ids)
            )
        ).all()
    return [(row[0], row[1]) for row in rows]
