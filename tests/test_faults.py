"""Faults: killed and frozen workers, a restarted and a stopped database.

Each test ends with the same proof (`assert_intact`): every custom_id exactly once across the
output and error files, counts equal to the files, no request sent to an engine after its
result was persisted, and no engine process left behind. Workers run the real worker process
on the scripted engine (tests/fake_worker.py); the database is a private PostgreSQL cluster,
so it can be restarted and stopped without touching the shared one.
"""

import os
import random
import secrets
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
import openai
import psutil
import pytest
from moto.server import ThreadedMotoServer

from app.config import Settings
from tests.engine_fixtures import (
    Deployment,
    FakeWorkerProcess,
    WorkerProcess,
    chat_line,
    jsonl,
    persisted,
    results,
    serving,
    shards_of,
    smollm2_args,
    start_batch,
    wait_completed,
    wait_status,
)
from tests.harness import free_port
from tests.private_postgres import PrivatePostgres

pytestmark = pytest.mark.faults

LEASE_SECONDS = 3.0


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[PrivatePostgres]:
    cluster = PrivatePostgres()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.remove()


@dataclass
class Mark:
    """Lines persisted at one moment, and how far each submission log had got just after."""

    persisted: set[int]
    offsets: dict[Path, int]


@dataclass
class Faulted(Deployment):
    """A deployment under test: the API in this process, workers in their own."""

    marks: list[Mark] = field(default_factory=list)
    engine_processes: list[psutil.Process] = field(default_factory=list)

    def start_fake(self, name: str, delay: float) -> WorkerProcess:
        worker = FakeWorkerProcess(self.settings, name, ["--delay", str(delay)])
        self.workers[name] = worker
        return worker

    def kill(self, worker: WorkerProcess) -> None:
        self.engine_processes += worker.descendants()
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait(10)

    def mark(self, batch_id: str) -> None:
        """Remember what is persisted now: no log may send any of it after this point."""
        done = set(persisted(self.settings, batch_id))
        offsets = {w.submissions_path: _size(w.submissions_path) for w in self.workers.values()}
        self.marks.append(Mark(done, offsets))


def _size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def _sent_after(path: Path, offset: int, batch_id: str) -> set[int]:
    if not path.exists():
        return set()
    words = path.read_bytes()[offset:].decode().split()
    return {int(n) for b, n in zip(words[::2], words[1::2], strict=True) if b == batch_id}


@contextmanager
def deployment(
    private_postgres: PrivatePostgres, data_dir: Path, **settings: Any
) -> Iterator[Faulted]:
    url = private_postgres.create_database("overnight_" + secrets.token_hex(6))
    values = {
        "shard_lines": 50,
        "lease_seconds": LEASE_SECONDS,
        "worker_checkpoint_seconds": 0.2,
        "worker_poll_seconds": 0.2,
        "worker_drain_seconds": 1.0,
        "housekeeping_interval_seconds": 0.2,
        **settings,
    }
    configured = Settings(data_dir=data_dir, database_url=url, _env_file=None, **values)  # type: ignore[call-arg]
    with serving(configured, Faulted) as running:
        yield running


@pytest.fixture
def faulted(private_postgres: PrivatePostgres, tmp_path: Path) -> Iterator[Faulted]:
    with deployment(private_postgres, tmp_path) as running:
        yield running


class RestartableS3:
    """A moto S3 endpoint that can go away and come back on its port, its objects kept.

    moto keeps its buckets in this process, so a stopped and restarted server still has them,
    as a real S3 service would after an outage.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: ThreadedMotoServer | None = None

    def start(self) -> None:
        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        """Refuse connections from now on, as a killed endpoint does."""
        assert self.server is not None and self.server._server is not None
        self.server.stop()
        self.server._server.server_close()


def assert_intact(deployment: Faulted, batch: openai.types.Batch, n: int) -> None:
    with deployment.client() as client:
        by_id = results(client, batch)
    assert set(by_id) == {f"r{i}" for i in range(n)}
    counts = batch.request_counts
    assert counts is not None and counts.total == n
    assert counts.completed == sum(1 for v in by_id.values() if v["error"] is None)
    assert counts.failed == n - counts.completed == 0
    for mark in deployment.marks:
        for worker in deployment.workers.values():
            path = worker.submissions_path
            rerun = _sent_after(path, mark.offsets.get(path, 0), batch.id) & mark.persisted
            assert not rerun, f"{worker.name} ran persisted lines again: {sorted(rerun)[:10]}"
    _, alive = psutil.wait_procs(deployment.engine_processes, timeout=60)
    assert not alive, f"engine processes outlived their worker: {[p.pid for p in alive]}"


def lines(n: int, **body: object) -> bytes:
    return jsonl([chat_line(f"r{i}", **body) for i in range(n)])


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def held_by(deployment: Faulted, batch_id: str, worker: WorkerProcess) -> list[int]:
    """The shards the worker holds a live lease on."""
    shards = shards_of(deployment.settings, batch_id)
    return [s.id for s in shards if s.status == "running" and s.lease_owner == worker.name]


def wait_holding(deployment: Faulted, batch_id: str, worker: WorkerProcess) -> None:
    holding = lambda: bool(held_by(deployment, batch_id, worker))  # noqa: E731
    wait_for(holding, 30, f"{worker.name} to hold a shard")


def test_sigkill_workers_at_random_moments(faulted: Faulted) -> None:
    n, kills = 3000, 0
    slots = [faulted.start_fake(f"w{i}-0", delay=0.1) for i in range(2)]
    rng = random.Random(11)
    with faulted.client() as client:
        batch_id = start_batch(client, lines(n))
        wait_completed(client, batch_id, 50)
        while kills < 10:
            time.sleep(rng.uniform(0.3, 1.5))
            assert client.batches.retrieve(batch_id).status == "in_progress", f"{kills} kills"
            slot = rng.randrange(2)
            victim = slots[slot]
            wait_holding(faulted, batch_id, victim)
            faulted.kill(victim)
            kills += 1
            faulted.mark(batch_id)
            slots[slot] = faulted.start_fake(f"w{slot}-{kills}", delay=0.1)
        batch = wait_status(client, batch_id, "completed", timeout=120)
    assert_intact(faulted, batch, n)
    taken_over = sum(s.attempts - 1 for s in shards_of(faulted.settings, batch_id))
    assert taken_over >= kills, "every kill left a shard for another holder"


def test_database_restart_and_outage_stop_no_worker(
    faulted: Faulted, private_postgres: PrivatePostgres
) -> None:
    n = 1500
    workers = [faulted.start_fake(f"w{i}", delay=0.1) for i in range(2)]
    with faulted.client() as client:
        batch_id = start_batch(client, lines(n))
        wait_completed(client, batch_id, 200)
        private_postgres.restart()
        faulted.mark(batch_id)
        wait_completed(client, batch_id, 500)
        faulted.mark(batch_id)
        late = lambda: faulted.start_fake("late", delay=0.1)  # noqa: E731
        everyone = stop_the_database(private_postgres, workers, late)
        batch = wait_status(client, batch_id, "completed", timeout=120)

    # The batch can end while the late worker still sleeps in its backoff (up to 5 s) or
    # migrates on a loaded machine: a bound on how busy the machine is, not on the retry.
    def back() -> bool:
        return all(w.state() == "ready" or w.process.poll() is not None for w in everyone)

    wait_for(back, 60, "every worker to be ready again")
    for worker in everyone:
        assert worker.process.poll() is None, f"{worker.name} exited:\n{worker.tail()}"
        assert worker.state() == "ready", worker.tail()
    assert_intact(faulted, batch, n)
    logs = [worker.tail(200_000) for worker in workers]
    for log in logs:
        waits, returns = log.count(": waiting_for_database"), log.count("database answers again")
        assert waits == returns >= 1, "each outage is logged once, not once per retry"
    assert "letting the shard go" in "".join(logs)


def stop_the_database(
    database: PrivatePostgres, workers: list[WorkerProcess], start_late: Callable[[], WorkerProcess]
) -> list[WorkerProcess]:
    """Stop it for at least twice the lease, with every worker waiting; returns theirs and the
    one started during the outage."""
    database.stop()
    stopped_at = time.monotonic()
    everyone = [*workers, start_late()]
    for worker in everyone:
        # A cold start of the process takes seconds on a loaded machine.
        wait_for(
            lambda w=worker: w.state() == "waiting_for_database",  # type: ignore[misc]
            30,
            f"{worker.name} to wait for the database",
        )
    time.sleep(max(0.0, 2 * LEASE_SECONDS - (time.monotonic() - stopped_at)))
    database.start()
    return everyone


# Two holes this found: a worker stopped inside a checkpoint kept the shard's row locked, so
# no claim (SKIP LOCKED) could take it over until it woke; and the woken worker sent queued
# lines to its engine before its first checkpoint told it the shard was gone.
def test_sigstopped_worker_is_fenced_when_it_wakes(faulted: Faulted) -> None:
    n = 1000
    frozen, _ = (faulted.start_fake(f"w{i}", delay=0.1) for i in range(2))
    with faulted.client() as client:
        batch_id = start_batch(client, lines(n))
        wait_completed(client, batch_id, 100)

        while True:
            wait_holding(faulted, batch_id, frozen)
            os.kill(frozen.process.pid, signal.SIGSTOP)
            if held := held_by(faulted, batch_id, frozen):
                break
            os.kill(frozen.process.pid, signal.SIGCONT)  # its shard ended just before
        shard_id = held[0]
        faulted.mark(batch_id)

        def taken_over() -> bool:
            shard = next(s for s in shards_of(faulted.settings, batch_id) if s.id == shard_id)
            return shard.lease_owner != "w0"

        # The other worker takes a lapsed lease once it looks for work: a bound on how busy
        # the machine may be, not on the lease (the batch cannot end without the takeover).
        wait_for(taken_over, 120, "the frozen worker's shard to be taken over")
        faulted.mark(batch_id)
        os.kill(frozen.process.pid, signal.SIGCONT)
        batch = wait_status(client, batch_id, "completed", timeout=120)
    assert frozen.process.poll() is None, frozen.tail()
    index = next(s.index for s in shards_of(faulted.settings, batch_id) if s.id == shard_id)
    assert f"shard {index} of {batch_id}: lost" in frozen.tail(200_000)
    assert_intact(faulted, batch, n)


def test_s3_endpoint_killed_and_restarted_mid_batch(
    private_postgres: PrivatePostgres, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3 = RestartableS3()
    s3.start()
    boto3.client("s3", endpoint_url=s3.url).create_bucket(Bucket="faults")
    store = {"storage_url": "s3://faults/deploy", "s3_endpoint_url": s3.url}
    n = 1500
    try:
        with deployment(private_postgres, tmp_path, **store) as running:
            for i in range(2):
                running.start_fake(f"w{i}", delay=0.1)
            with running.client() as client:
                batch_id = start_batch(client, lines(n))
                wait_completed(client, batch_id, 300)
                running.mark(batch_id)
                s3.stop()
                time.sleep(2 * LEASE_SECONDS)
                s3.start()
                batch = wait_status(client, batch_id, "completed", timeout=120)
            for worker in running.workers.values():
                assert worker.process.poll() is None, f"{worker.name} exited:\n{worker.tail()}"
            assert_intact(running, batch, n)
    finally:
        s3.stop()


@pytest.mark.engine
def test_the_real_engine_stays_loaded_through_a_database_outage(
    private_postgres: PrivatePostgres, tmp_path: Path, smollm2: Path
) -> None:
    n = 48
    with deployment(private_postgres, tmp_path, shard_lines=8) as running:
        worker = running.start_worker("real", smollm2_args(smollm2))
        worker.wait_ready()
        engine = worker.descendants()
        assert engine, "the worker has no engine processes"
        with running.client() as client:
            batch_id = start_batch(client, lines(n, max_tokens=16, temperature=0))
            wait_completed(client, batch_id, 8, timeout=300)
            running.mark(batch_id)
            late = lambda: running.start_fake("late", delay=0.1)  # noqa: E731
            stop_the_database(private_postgres, [worker], late)
            batch = wait_status(client, batch_id, "completed", timeout=300)
        assert worker.process.poll() is None, worker.tail()
        assert set(engine) <= set(worker.descendants()), "the engine was not kept loaded"
        running.engine_processes += engine
        worker.stop()
        assert worker.process.returncode == 0, worker.tail()
        assert_intact(running, batch, n)
