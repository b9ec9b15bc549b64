"""The worker's batch path with a scripted engine: real API, SDK, database and finalizer.

Fast checks of what the real-engine tests cannot make happen on demand: dedup counts, lease
takeover with fencing, SIGTERM release, two workers on one batch.
"""

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest
from sqlalchemy import update

from app.config import Settings
from app.core.leases import ShardLease
from app.core.progress import Progress
from app.db.models import Batch, Shard
from app.db.session import session_scope
from tests.engine_fixtures import (
    chat_line,
    jsonl,
    results,
    shards_of,
    start_batch,
    wait_completed,
    wait_status,
    wait_until,
)
from tests.fake_engine import MODEL, FakeEngine, ThreadedWorker, fast
from tests.harness import PRODUCT_LEASE_SECONDS, RunningServer, running_server
from worker import claim
from worker.engine import EngineDeadError
from worker.engine_results import EngineResult


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    tuned = fast(settings, shard_lines=5, lease_seconds=PRODUCT_LEASE_SECONDS)
    with running_server(tuned) as running:
        yield running


def test_batch_with_duplicates_and_bad_lines(server: RunningServer, client: openai.OpenAI) -> None:
    lines = [chat_line(f"ok-{i}") for i in range(12)]
    lines += [chat_line(f"dup-{i}", "same question", temperature=0) for i in range(4)]
    lines += [chat_line("stream", stream=True)]
    lines += [chat_line(f"sampled-{i}", "same question") for i in range(2)]
    engine = FakeEngine()
    with ThreadedWorker(server.settings, engine):
        batch_id = start_batch(client, jsonl(lines))
        batch = wait_status(client, batch_id, "completed")
    by_id = results(client, batch)
    assert len(by_id) == 19
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (18, 1)
    stream = by_id["stream"]
    assert stream["response"]["status_code"] == 400
    assert stream["response"]["body"]["error"]["param"] == "stream"
    # Four identical greedy requests ran once; sampled ones are never merged.
    assert len(engine.calls) == 19 - 3
    dups = [by_id[f"dup-{i}"] for i in range(4)]
    assert len({d["response"]["body"]["id"] for d in dups}) == 4
    assert len({d["response"]["request_id"] for d in dups}) == 4
    assert {d["response"]["body"]["choices"][0]["message"]["content"] for d in dups} == {
        "noitseuq emas"
    }
    ids = [item["id"] for item in by_id.values()]
    assert len(set(ids)) == 19 and all(i.startswith("batch_req_") for i in ids)
    assert all(item["response"]["request_id"].startswith("req_") for item in by_id.values())
    assert batch.usage is not None and batch.usage.output_tokens == 18 * 2


def test_counts_move_while_running(server: RunningServer, client: openai.OpenAI) -> None:
    engine = FakeEngine(delay=0.15, max_num_seqs=1)
    with ThreadedWorker(server.settings, engine):
        batch_id = start_batch(client, jsonl([chat_line(f"r{i}") for i in range(16)]))
        seen = wait_until(
            client,
            batch_id,
            lambda b: (
                b.status == "in_progress"
                and b.request_counts is not None
                and 0 < b.request_counts.completed < 16
            ),
            timeout=30,
        )
        assert seen.usage is not None and seen.usage.output_tokens > 0
        batch = wait_status(client, batch_id, "completed")
    assert batch.request_counts is not None and batch.request_counts.completed == 16
    assert engine.peak <= 2  # the window: 2 x max_num_seqs


def test_cancel_aborts_in_flight(server: RunningServer, client: openai.OpenAI) -> None:
    lines = [chat_line(f"quick-{i}", delay=0.01) for i in range(3)]
    lines += [chat_line(f"slow-{i}", delay=60) for i in range(9)]
    engine = FakeEngine(max_num_seqs=4)
    with ThreadedWorker(server.settings, engine):
        batch_id = start_batch(client, jsonl(lines))
        wait_completed(client, batch_id, 3)
        started = time.monotonic()
        client.batches.cancel(batch_id)
        batch = wait_status(client, batch_id, "cancelled", timeout=20)
        # Without the abort it would wait out the slow lines' 60 s.
        assert time.monotonic() - started < 15
    assert engine.aborted, "in-flight requests were not aborted"
    by_id = results(client, batch)
    assert {k for k, v in by_id.items() if v["error"] is None} == {f"quick-{i}" for i in range(3)}
    cancelled = [v for v in by_id.values() if v["error"] is not None]
    assert len(cancelled) == 9
    assert {v["error"]["code"] for v in cancelled} == {"batch_cancelled"}
    assert all(
        s.status != "running" and s.lease_owner is None
        for s in shards_of(server.settings, batch_id)
    )


def test_expiry_stops_the_run(server: RunningServer, client: openai.OpenAI) -> None:
    lines = [chat_line(f"quick-{i}", delay=0.01) for i in range(2)]
    lines += [chat_line(f"slow-{i}", delay=60) for i in range(4)]
    engine = FakeEngine(max_num_seqs=4)
    with ThreadedWorker(server.settings, engine):
        batch_id = start_batch(client, jsonl(lines))
        wait_completed(client, batch_id, 2)
        with session_scope(server.settings) as session:
            session.execute(
                update(Batch).where(Batch.id == batch_id).values(expires_at=int(time.time()))
            )
        batch = wait_status(client, batch_id, "expired", timeout=10)
    assert engine.aborted
    by_id = results(client, batch)
    expired = {k for k, v in by_id.items() if v["error"] is not None}
    assert expired == {f"slow-{i}" for i in range(4)}
    assert {by_id[k]["error"]["code"] for k in expired} == {"batch_expired"}


def test_stale_lease_is_taken_over_and_fenced(server: RunningServer, client: openai.OpenAI) -> None:
    settings = server.settings
    batch_id = start_batch(client, jsonl([chat_line(f"r{i}") for i in range(5)]))
    wait_status(client, batch_id, "in_progress")
    with session_scope(settings) as session:
        dead = claim.claim_shard(session, "dead-worker", ["SmolLM2-135M-Instruct"], 3.0)
    assert dead is not None and dead.line_count == 5
    # The dead worker recorded lines 1-2 before it stopped.
    key = dead.chunk_key(0)
    data = jsonl(
        [
            b'{"line":1,"output":{"id":"batch_req_a","custom_id":"r0","response":{"status_code":200,"request_id":"req_a","body":{"usage":{"prompt_tokens":1,"completion_tokens":1}}},"error":null}}'
        ]
    )
    from app.storage import storage_for
    from app.storage.base import put

    put(storage_for(str(settings.storage_dir)), key, [data])
    with session_scope(settings) as session:
        state = claim.checkpoint(session, dead, chunk=(0, key, 1), progress=Progress(completed=1))
    assert state is not None and state.status == "in_progress"
    with session_scope(settings) as session:  # its last renewal, two leases ago
        lapsed = Shard.heartbeat_at - 2 * settings.lease_seconds
        session.execute(update(Shard).where(Shard.id == dead.shard_id).values(heartbeat_at=lapsed))
    engine = FakeEngine()
    with ThreadedWorker(settings, engine):
        batch = wait_status(client, batch_id, "completed", timeout=20)
    assert sorted(b["messages"][0]["content"] for b in engine.bodies()) == [
        f"hello r{i}" for i in range(1, 5)
    ]
    assert results(client, batch)["r0"]["id"] == "batch_req_a"
    with session_scope(settings) as session:
        assert claim.checkpoint(session, dead, progress=Progress(completed=1)) is None


def test_sigterm_releases_and_another_worker_finishes(
    server: RunningServer, client: openai.OpenAI
) -> None:
    settings = server.settings
    lines = [chat_line(f"r{i}", delay=0.05 if i < 3 else 5) for i in range(5)]
    first = FakeEngine(max_num_seqs=1)
    with ThreadedWorker(settings, first) as worker:
        batch_id = start_batch(client, jsonl(lines))
        wait_completed(client, batch_id, 2)
        worker.stop()
        assert worker.exit_code == 0
    [shard] = shards_of(settings, batch_id)
    assert shard.status == "pending" and shard.lease_owner is None
    ran_first = {b["messages"][0]["content"] for b in first.bodies()}
    second = FakeEngine()
    with ThreadedWorker(settings, second, worker_id="second"):
        batch = wait_status(client, batch_id, "completed", timeout=20)
    kept = {f"hello {k}" for k, v in results(client, batch).items()} - {
        b["messages"][0]["content"] for b in second.bodies()
    }
    assert kept and kept <= ran_first
    assert len(first.bodies()) + len(second.bodies()) >= 5
    # The second worker runs exactly the lines not checkpointed at the release.
    rerun = {b["messages"][0]["content"] for b in second.bodies()}
    assert shard.completed + len(rerun) == 5


def test_two_workers_share_one_batch(server: RunningServer, client: openai.OpenAI) -> None:
    one, two = FakeEngine(delay=0.05, max_num_seqs=1), FakeEngine(delay=0.05, max_num_seqs=1)
    with (
        ThreadedWorker(server.settings, one, worker_id="one"),
        ThreadedWorker(server.settings, two, worker_id="two"),
    ):
        batch_id = start_batch(client, jsonl([chat_line(f"r{i}") for i in range(30)]))
        batch = wait_status(client, batch_id, "completed", timeout=30)
    assert one.calls and two.calls
    contents = [b["messages"][0]["content"] for b in one.bodies() + two.bodies()]
    assert sorted(contents) == sorted(f"hello r{i}" for i in range(30))
    assert len(results(client, batch)) == 30


class DyingEngine(FakeEngine):
    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        if len(self.calls) >= 3:
            raise EngineDeadError("the engine core died")
        return await super().run(endpoint, body, request_id)


def test_a_dead_engine_stops_the_worker_and_frees_its_shard(
    server: RunningServer, client: openai.OpenAI
) -> None:
    engine = DyingEngine(max_num_seqs=1)
    with ThreadedWorker(server.settings, engine) as worker:
        batch_id = start_batch(client, jsonl([chat_line(f"r{i}") for i in range(5)]))
        deadline = time.monotonic() + 20
        while worker.exit_code is None:
            assert time.monotonic() < deadline, "the worker kept running on a dead engine"
            time.sleep(0.05)
    assert worker.exit_code == 1
    [shard] = shards_of(server.settings, batch_id)
    assert shard.status == "pending" and shard.lease_owner is None
    assert shard.completed >= 2  # what finished before the engine died is kept


def test_concurrent_claims_never_share_a_shard(
    server: RunningServer, client: openai.OpenAI
) -> None:
    batch_id = start_batch(client, jsonl([chat_line(f"r{i}") for i in range(40)]))
    wait_status(client, batch_id, "in_progress")

    def take(n: int) -> ShardLease | None:
        with session_scope(server.settings) as session:
            return claim.claim_shard(session, f"w{n}", [MODEL], 30.0)

    with ThreadPoolExecutor(max_workers=10) as pool:
        leases = list(pool.map(take, range(10)))
    taken = [lease for lease in leases if lease is not None]
    assert len(taken) == 8 and len({lease.shard_id for lease in taken}) == 8
    assert {lease.epoch for lease in taken} == {1}
    assert take(99) is None
    with session_scope(server.settings) as session:
        assert claim.claim_shard(session, "other-model", ["all-MiniLM-L6-v2"], 0.0) is None
