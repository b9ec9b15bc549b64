"""A deployment under injected faults: a batch driven to its end, uploads sent, invariants read.

The batch runs as in production: validation and finalization as the API's housekeeping runs
them, a real `Worker` on a scripted engine that logs every request it is sent (custom_id and
request id), so a test can tell which run of a line gave the result the files hold.
"""

import asyncio
import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, File
from app.db.session import engine_for, read_session_factory, session_scope
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.steps.chunk_cleanup import delete_leftover_chunks
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.storage import Storage, storage_of
from tests import batch_sim as sim
from tests.engine_fixtures import chat_line, jsonl
from tests.fake_engine import FakeEngine, fast
from tests.fault_points import FaultingStorage, Injector, recorded_chunk_check
from tests.test_finalizer import lines_of
from worker.engine_results import EngineResult
from worker.loop import Worker, WorkerOptions

log = logging.getLogger("tests.faults")

LINES = 10
ENDED = {str(status) for status in TERMINAL_BATCH_STATUSES}


def fault_settings(data_dir: Path, database_url: str) -> Settings:
    """Short leases and ticks, and shards of 4 lines: every point is reached in a second."""
    base = Settings(data_dir=data_dir, database_url=database_url, _env_file=None)  # type: ignore[call-arg]
    return fast(
        base,
        shard_lines=4,
        lease_seconds=2.0,
        worker_checkpoint_seconds=0.05,
        worker_drain_seconds=0.5,
    )


@dataclass(frozen=True)
class Deployment:
    """One scenario's deployment, and the logs its processes append to."""

    settings: Settings

    @property
    def calls(self) -> Path:
        return self.settings.data_dir / "engine-calls.log"

    @property
    def violations(self) -> Path:
        return self.settings.data_dir / "violations.log"

    def storage(self, injector: Injector | None = None) -> FaultingStorage:
        url = self.settings.sqlalchemy_url
        recorded = recorded_chunk_check(read_session_factory(url))
        return FaultingStorage(storage_of(self.settings), injector, recorded, str(self.violations))

    def arm(self, injector: Injector) -> Injector:
        return injector.install(engine_for(self.settings.sqlalchemy_url))


class LoggingEngine(FakeEngine):
    """The scripted engine, logging each request it is sent, unbuffered (it survives
    `os._exit`)."""

    def __init__(self, calls: Path) -> None:
        super().__init__(delay=0.02)
        self._fd = os.open(calls, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        custom_id = str(body["messages"][-1]["content"]).removeprefix("hello ")
        os.write(self._fd, f"{custom_id} req_{request_id}\n".encode())
        return await super().run(endpoint, body, request_id)


def create_batch(deployment: Deployment, slow_after: int = LINES) -> tuple[str, list[str]]:
    """A `validating` batch of `LINES` requests (one of them answered with an error); those
    from line `slow_after` on take the engine a while, so that a checkpoint comes before."""
    settings = deployment.settings
    ids = [f"r{i}" for i in range(LINES)]
    lines = [
        chat_line(cid, stream=cid == "r3", delay=0.5 if i >= slow_after else 0.02)
        for i, cid in enumerate(ids)
    ]
    file_id = sim.store_input_file(settings, jsonl(lines))
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint=sim.CHAT, completion_window="24h"
        )
        return batches.create_batch(session, settings, project_id, params).id, ids


def status_of(settings: Settings, batch_id: str) -> str:
    with session_scope(settings) as session:
        return str(session.scalar(select(Batch.status).where(Batch.id == batch_id)))


def _housekeep(settings: Settings, storage: Storage) -> None:
    """The API's housekeeping steps for batches; each step's failure is logged, as there."""
    for step in (validate_pending, finalize_ready_batches):
        try:
            step(settings, "housekeeping", storage)
        except Exception:
            log.exception("%s failed", step.__name__)
    try:
        delete_leftover_chunks(settings, storage)
    except Exception:
        log.exception("deleting leftover chunks failed")


async def drive(deployment: Deployment, storage: Storage, batch_id: str, timeout: float) -> str:
    """Runs housekeeping and a worker (restarted if it stops, as `overnight serve` does) until
    the batch ends or `timeout`; returns its status."""
    settings = deployment.settings
    engine = LoggingEngine(deployment.calls)
    stop = asyncio.Event()
    options = WorkerOptions(worker_id=f"fault-worker-{os.getpid()}")
    worker: asyncio.Task[int] | None = None
    deadline = time.monotonic() + timeout
    status = ""
    try:
        while time.monotonic() < deadline:
            if worker is None or worker.done():
                worker = asyncio.create_task(Worker(settings, engine, options, storage).run(stop))
            await asyncio.to_thread(_housekeep, settings, storage)
            status = await asyncio.to_thread(status_of, settings, batch_id)
            if status in ENDED:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        if worker is not None:
            await asyncio.wait_for(asyncio.gather(worker, return_exceptions=True), 60)
    return status


# -- invariants --
def last_runs(calls: Path) -> dict[str, str]:
    """Each custom_id's last request id sent to the engine."""
    runs: dict[str, str] = {}
    for line in calls.read_text().splitlines() if calls.exists() else []:
        custom_id, request_id = line.split()
        runs[custom_id] = request_id
    return runs


def assert_batch_intact(deployment: Deployment, batch_id: str, ids: list[str]) -> None:
    """Completed; every custom_id once; counts equal the files; each result is its line's
    last run (an earlier run whose result was persisted would have won the merge)."""
    settings = deployment.settings
    batch = sim.load_batch(settings, batch_id)
    assert batch.status == "completed", f"the batch ended {batch.status}: {batch.errors}"
    output = lines_of(settings, batch.output_file_id)
    errors = lines_of(settings, batch.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(ids)
    assert (batch.total, batch.completed, batch.failed) == (len(ids), len(output), len(errors))
    assert [line["custom_id"] for line in errors] == ["r3"]
    runs = last_runs(deployment.calls)
    for line in output + errors:
        run_again = line["response"]["request_id"] != runs[line["custom_id"]]
        assert not run_again, f"{line['custom_id']}: a persisted result was run again"
    assert_no_violations(deployment)
    assert_files_intact(settings)


def assert_no_violations(deployment: Deployment) -> None:
    seen = deployment.violations.read_text() if deployment.violations.exists() else ""
    assert seen == "", seen


def assert_files_intact(settings: Settings) -> None:
    """No visible File whose bytes are missing or cut short."""
    storage = storage_of(settings)
    with session_scope(settings) as session:
        rows = session.execute(
            select(File.id, File.storage_key, File.bytes, File.sha256).where(
                File.deleted_at.is_(None)
            )
        ).all()
    for file_id, key, size, sha256 in rows:
        assert storage.exists(key), f"File {file_id} is visible, its object {key} is gone"
        digest = hashlib.sha256(b"".join(storage.read(key))).hexdigest()
        assert (storage.size(key), digest) == (size, sha256), f"File {file_id} is cut short"


Armed = TypeVar("Armed", bound=Injector)


@contextlib.contextmanager
def armed(deployment: Deployment, injector: Armed) -> Iterator[Armed]:
    deployment.arm(injector)
    try:
        yield injector
    finally:
        injector.remove()
