"""When the engine gets work: as soon as a batch is in_progress, and across shard boundaries.

A scripted engine and the real worker loop on the real database; the assertions are about
order and about bounds far below the poll interval, not about speed.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import orjson
import pytest

from app.config import Settings
from app.db.session import session_scope, upgrade
from app.endpoints import CHAT
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.steps.validation import validate_pending
from app.storage import storage_of
from tests import batch_sim
from tests.fake_engine import MODEL, FakeEngine, ThreadedWorker
from worker.engine_results import EngineResult
from worker.health import HealthState


class Recording(FakeEngine):
    """Remembers when each line entered the engine, and how many others it held then."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.started: dict[int, float] = {}
        self.beside: dict[int, int] = {}

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        line = int(body["messages"][-1]["content"])
        self.started[line], self.beside[line] = time.monotonic(), self.running
        return await super().run(endpoint, body, request_id)


def in_progress_batch(settings: Settings, lines: int, shortest: float = 0.1) -> str:
    """A batch of `lines` requests through creation and validation: in_progress.

    Line i asks for itself as content and takes `shortest` to 3.4 times that in the engine:
    spread out, so that finishing requests free their slots one at a time.
    """
    bodies = (
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": str(i)}],
            "delay": shortest * (1 + 0.4 * (i % 7)),
        }
        for i in range(lines)
    )
    data = batch_sim.jsonl(
        orjson.dumps({"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": body})
        for i, body in enumerate(bodies)
    )
    file_id = batch_sim.store_input_file(settings, data)
    with session_scope(settings) as session:
        project = ensure_project(session, DEFAULT_PROJECT).id
        request = CreateBatchRequest(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
        batch_id = batches.create_batch(session, settings, project, request).id
    validate_pending(settings, "test", storage_of(settings))
    assert batch_sim.load_batch(settings, batch_id).status == "in_progress"
    return batch_id


def wait_for(condition: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def watching(settings: Settings, backend: str) -> Settings:
    """SQLite with a poll so slow that only the database watch can find work in a test."""
    if backend != "sqlite":
        pytest.skip("PostgreSQL has no change counter to watch: there the worker polls")
    settings = settings.model_copy(update={"worker_poll_seconds": 60.0, "lease_seconds": 600.0})
    upgrade(settings.sqlalchemy_url)
    return settings


@contextmanager
def idle_worker(settings: Settings, engine: FakeEngine) -> Iterator[ThreadedWorker]:
    """A ready worker whose first claim, which found nothing, is behind it."""
    with ThreadedWorker(settings, engine) as worker:
        wait_for(
            lambda: worker.worker is not None and worker.worker.health.state is HealthState.READY
        )
        time.sleep(0.5)
        yield worker


def test_an_idle_worker_claims_as_the_batch_goes_in_progress(
    settings: Settings, backend: str
) -> None:
    settings = watching(settings, backend)
    engine = Recording()
    with idle_worker(settings, engine):
        started = time.monotonic()
        batch_id = in_progress_batch(settings, 4)
        wait_for(lambda: len(engine.started) == 4)
        picked_up = min(engine.started.values()) - started
        wait_for(lambda: batch_sim.load_batch(settings, batch_id).status == "completed")
    assert picked_up < 2.0, f"the first request reached the engine {picked_up:.2f} s after"


def test_the_next_shard_reaches_the_engine_before_the_current_one_drains(
    settings: Settings,
) -> None:
    shard_lines, shards = 24, 3
    settings = settings.model_copy(update={"shard_lines": shard_lines})
    upgrade(settings.sqlalchemy_url)
    engine = Recording(max_num_seqs=4)  # a window of 8
    with ThreadedWorker(settings, engine):
        # The next shard's claim and read must fit in what the window still holds: 16 lines
        # of 0.3 to 1 s, about 1.3 s. With a third of that, a claim on PostgreSQL in a full
        # run (three test processes on two cores) came late once: 3 lines were left beside.
        batch_id = in_progress_batch(settings, shard_lines * shards, shortest=0.3)
        wait_for(lambda: batch_sim.load_batch(settings, batch_id).status == "completed", 60)
    assert engine.peak == 8
    for shard in range(1, shards):
        lines = range(shard * shard_lines, (shard + 1) * shard_lines)
        first = min(lines, key=lambda line: engine.started[line])
        # Had the engine drained at the boundary, nothing would have been beside it; in a
        # window refilled one slot at a time, about 7 requests of the shard before were.
        assert engine.beside[first] >= 4, (shard, engine.beside[first])


def test_an_idle_worker_does_not_claim_on_every_commit_of_others(
    settings: Settings, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from worker import claim

    settings = watching(settings, backend)
    claims: list[float] = []
    real_claim = claim.claim_shard

    def counted(*args: Any, **kwargs: Any) -> Any:
        claims.append(time.monotonic())
        return real_claim(*args, **kwargs)

    monkeypatch.setattr(claim, "claim_shard", counted)
    engine = Recording()
    with idle_worker(settings, engine):
        before = len(claims)
        # Another process's checkpoints, say: 60 commits that give this worker nothing to do.
        for i in range(60):
            with session_scope(settings) as session:
                ensure_project(session, f"other-{i}")
            time.sleep(0.05)
        idle_claims = len(claims) - before
        started = time.monotonic()
        in_progress_batch(settings, 2)
        wait_for(lambda: len(engine.started) == 2)
        picked_up = min(engine.started.values()) - started
    assert idle_claims <= 15, f"{idle_claims} claims for 60 unrelated commits"
    assert picked_up < 2.0, f"the first request reached the engine {picked_up:.2f} s after"


def test_a_shards_first_holder_reads_no_recorded_chunks(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shard's first lease has nobody's results to skip: no query for them beside the claim.
    (A later holder still reads them: tests/test_faults.py kills holders and counts lines.)"""
    from worker import claim

    settings = settings.model_copy(update={"shard_lines": 2})
    upgrade(settings.sqlalchemy_url)
    looked_up: list[int] = []
    real = claim.recorded_chunk_keys

    def counted(session: Any, shard_id: int) -> list[str]:
        looked_up.append(shard_id)
        return real(session, shard_id)

    monkeypatch.setattr(claim, "recorded_chunk_keys", counted)
    with ThreadedWorker(settings, Recording()):
        batch_id = in_progress_batch(settings, 6)
        wait_for(lambda: batch_sim.load_batch(settings, batch_id).status == "completed", 60)
    assert looked_up == []
    assert batch_sim.load_batch(settings, batch_id).completed == 6
