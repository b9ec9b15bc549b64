"""Helpers shared by the worker tests: input lines, waiting on batches, reading result files."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import openai
import orjson
import psutil
from sqlalchemy import select

from app.config import Settings
from app.db.models import RegisteredWorker as WorkerRow
from app.db.models import ResultChunk, Shard
from app.db.session import session_scope
from app.storage import storage_of
from tests.harness import RunningServer, fresh_database, pauses, running_server

REPO = Path(__file__).resolve().parent.parent

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"


def chat_line(custom_id: str, content: str = "", model: str = MODEL, **body: Any) -> bytes:
    messages = [{"role": "user", "content": content or f"hello {custom_id}"}]
    request = {"model": model, "messages": messages, **body}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": request})


def line(custom_id: str, url: str, body: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(lines: list[bytes]) -> bytes:
    return b"".join(item + b"\n" for item in lines)


def start_batch(
    client: openai.OpenAI, data: bytes, endpoint: str = CHAT, name: str = "in.jsonl"
) -> str:
    file_id = client.files.create(file=(name, data, "application/jsonl"), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )
    return batch.id


def wait_until(
    client: openai.OpenAI,
    batch_id: str,
    done: Callable[[openai.types.Batch], bool],
    timeout: float = 60,
    longest_interval: float = 0.25,
) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    waits = pauses(longest_interval)
    while True:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}: {batch}"
        time.sleep(next(waits))


def wait_completed(
    client: openai.OpenAI, batch_id: str, at_least: int, timeout: float = 120
) -> openai.types.Batch:
    """Until at least this many requests of a running batch have a persisted success."""

    def enough(batch: openai.types.Batch) -> bool:
        return batch.request_counts is not None and batch.request_counts.completed >= at_least

    return wait_until(client, batch_id, enough, timeout, longest_interval=0.1)


def wait_status(
    client: openai.OpenAI, batch_id: str, *statuses: str, timeout: float = 60
) -> openai.types.Batch:
    return wait_until(client, batch_id, lambda b: b.status in statuses, timeout)


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(raw) for raw in client.files.content(file_id).content.splitlines()]


def results(client: openai.OpenAI, batch: openai.types.Batch) -> dict[str, dict[str, Any]]:
    """Every output and error line by custom_id; asserts each appears exactly once."""
    lines = file_lines(client, batch.output_file_id) + file_lines(client, batch.error_file_id)
    by_id = {item["custom_id"]: item for item in lines}
    assert len(by_id) == len(lines), "a custom_id appears more than once"
    return by_id


def persisted(settings: Settings, batch_id: str) -> dict[int, dict[str, Any]]:
    """Line number → output line, for every result recorded in the database (first wins)."""
    storage = storage_of(settings)
    with session_scope(settings) as session:
        keys = session.scalars(
            select(ResultChunk.storage_key)
            .join(Shard, Shard.id == ResultChunk.shard_id)
            .where(Shard.batch_id == batch_id)
            .order_by(ResultChunk.shard_id, ResultChunk.epoch, ResultChunk.sequence)
        ).all()
    found: dict[int, dict[str, Any]] = {}
    for key in keys:
        for raw in b"".join(storage.read(key)).splitlines():
            item = orjson.loads(raw)
            found.setdefault(item["line"], item["output"])
    return found


def shards_of(settings: Settings, batch_id: str) -> list[Shard]:
    with session_scope(settings) as session:
        rows = list(session.scalars(select(Shard).where(Shard.batch_id == batch_id)))
        session.expunge_all()
        return rows


# -- Real engines: one deployment (database + API server + worker processes) per session --

ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "2048"]
ENGINE_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # vLLM's `auto` binds every CPU engine's compute to the same core (it keeps the last one
    # for front ends); the three test processes' engines would all queue on core 0 while
    # core 1 idles. Unbound, with one compute thread each, the kernel spreads them: two
    # engine test files side by side took 391 s of wall time and 580 s of CPU against 435 s
    # and 680 s bound. (`overnight serve`'s own layout is the docs tests'.)
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "OMP_NUM_THREADS": "1",
    # The model runs in the engine core's process rather than a third one (on CPU vLLM
    # otherwise starts an executor process, to bind its threads: unbound, that buys nothing).
    # Each start imports vLLM twice instead of three times: a one-line run took 17.7 s of
    # wall time and 17.3 s of CPU against 23.2 s and 24.8 s. `overnight serve`'s tests (the
    # docs tests) keep vLLM's default three processes.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # `--enforce-eager` leaves vLLM's sampler helpers under torch.compile: an engine's first
    # request for logprobs compiled one with Inductor (a C++ build), 7 s of CPU on an idle
    # machine and 35 s of a loaded one's wall time, for a kernel that counts ranks. PyTorch's
    # switch runs them as written, with the same answers (greedy tokens and logprobs
    # compared). `overnight serve`'s tests (the docs tests) keep the default.
    "TORCH_COMPILE_DISABLE": "1",
}


def child_env(changes: dict[str, str | None]) -> dict[str, str]:
    """This process's environment with `changes`; None unsets, as on a machine without it."""
    environ = {**os.environ}
    for key, value in changes.items():
        if value is None:
            environ.pop(key, None)
        else:
            environ[key] = value
    return environ


class WorkerProcess:
    """`overnight worker` in a subprocess, with its log, submission log and health file."""

    # `overnight worker`, recording what it sends to its engine (tests.submission_log).
    PROGRAM: tuple[str, ...] = ("-m", "tests.recording_worker")

    def __init__(
        self,
        settings: Settings,
        name: str,
        model_args: list[str],
        env: dict[str, str | None] | None = None,
    ) -> None:
        self.settings = settings
        self.name = name
        self.model_args = model_args
        self.log_path = settings.data_dir / f"{name}.log"
        self.submissions_path = settings.data_dir / f"{name}.submissions"
        self.finished_path = settings.data_dir / f"{name}.finished"
        self.health_path = settings.data_dir / f"{name}.health"
        environ = child_env(
            {
                **ENGINE_ENV,
                "OVERNIGHT_DATABASE_URL": settings.sqlalchemy_url,
                "OVERNIGHT_DATA_DIR": str(settings.data_dir),
                "OVERNIGHT_LEASE_SECONDS": str(settings.lease_seconds),
                "OVERNIGHT_WORKER_CHECKPOINT_SECONDS": str(settings.worker_checkpoint_seconds),
                "OVERNIGHT_WORKER_POLL_SECONDS": str(settings.worker_poll_seconds),
                "OVERNIGHT_WORKER_DRAIN_SECONDS": str(settings.worker_drain_seconds),
                "OVERNIGHT_STORAGE_URL": settings.storage_url,
                "OVERNIGHT_S3_ENDPOINT_URL": settings.s3_endpoint_url,
                **(env or {}),
            }
        )
        # The model arguments first: a bare model id is taken there, as by `vllm serve`.
        command = [sys.executable, *self.PROGRAM, *model_args, "--worker-id", name]
        command += ["--submission-log", str(self.submissions_path)]
        command += ["--finished-log", str(self.finished_path)]
        command += ["--health-file", str(self.health_path)]
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(
                command, env=environ, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO
            )

    def wait_ready(self, timeout: float = 300) -> None:
        """Until the worker's engine runs (its row is written as `loading` before that)."""
        deadline = time.monotonic() + timeout
        while True:
            with session_scope(self.settings) as session:
                row = session.get(WorkerRow, self.name)
                if (
                    row is not None
                    and row.pid == self.process.pid
                    and row.stopped_at is None
                    and row.ready_at is not None
                ):
                    return
            code = self.process.poll()
            assert code is None, f"worker {self.name} exited with {code}:\n{self.tail()}"
            assert time.monotonic() < deadline, f"worker {self.name} did not start:\n{self.tail()}"
            time.sleep(0.5)

    def online_port(self) -> int:
        """The port of the worker's online API (`--online-port`)."""
        return int(self.model_args[self.model_args.index("--online-port") + 1])

    def state(self) -> str | None:
        """The state in the worker's health file (None before it wrote one)."""
        try:
            return str(orjson.loads(self.health_path.read_bytes())["state"])
        except FileNotFoundError:
            return None

    def tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def submissions(self, batch_id: str) -> list[int]:
        """The batch's lines in the order they went to the engine (a preempted one again)."""
        return _lines_of(self.submissions_path, batch_id)

    def finished(self, batch_id: str) -> list[int]:
        """The batch's lines whose answers came back from the engine, in that order."""
        return _lines_of(self.finished_path, batch_id)

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, timeout: float = 60) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _lines_of(log: Path, batch_id: str) -> list[int]:
    if not log.exists():
        return []
    words = log.read_text().split()
    return [int(n) for b, n in zip(words[::2], words[1::2], strict=True) if b == batch_id]


class FakeWorkerProcess(WorkerProcess):
    """The worker process on the scripted engine (`python -m tests.fake_worker`)."""

    PROGRAM = ("-m", "tests.fake_worker")


@dataclass
class Deployment:
    settings: Settings
    server: RunningServer
    workers: dict[str, WorkerProcess] = field(default_factory=dict)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.server.base_url,
            api_key="sk-test",
            max_retries=0,
            _strict_response_validation=True,
        )

    def start_worker(
        self, name: str, model_args: list[str], env: dict[str, str | None] | None = None
    ) -> WorkerProcess:
        worker = WorkerProcess(self.settings, name, model_args, env)
        self.workers[name] = worker
        return worker


D = TypeVar("D", bound=Deployment)


@contextmanager
def deployment(backend: str, data_dir: Path, **overrides: Any) -> Iterator[Deployment]:
    data_dir.mkdir(parents=True, exist_ok=True)
    with fresh_database(backend, data_dir, migrated=True) as url:
        defaults: dict[str, Any] = {
            "shard_lines": 16,
            "lease_seconds": 6.0,
            "housekeeping_interval_seconds": 0.5,
        }
        settings = Settings(  # type: ignore[call-arg]
            data_dir=data_dir, database_url=url, _env_file=None, **(defaults | overrides)
        )
        with serving(settings, Deployment) as running:
            yield running


@contextmanager
def serving(settings: Settings, kind: type[D]) -> Iterator[D]:
    """The API on these settings; every worker started on it is stopped afterwards."""
    with running_server(settings) as server:
        running = kind(server.settings, server)
        try:
            yield running
        finally:
            for worker in running.workers.values():
                worker.stop(timeout=20)


def smollm2_args(model_dir: Path) -> list[str]:
    return ["--model", str(model_dir), "--served-model-name", MODEL, *ENGINE_ARGS]
