"""`overnight serve`: the API and one worker per served model, kept running.

Each child runs in its own process group, so that stopping or restarting it also
ends whatever it started (vLLM's engine core processes): no engine outlives its
worker. A child that dies is restarted after a growing pause; Ctrl-C or SIGTERM
stops them all, gently first. On Linux a child is also sent SIGTERM when `serve` itself
dies, even by SIGKILL (`PR_SET_PDEATHSIG`), so that no API or worker outlives it.
"""

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.config import Settings
from app.db.session import session_scope
from app.schemas.admin import WorkerState
from app.services import monitoring
from app.version import overnight_version

log = logging.getLogger("overnight.serve")

BACKOFF_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0)
# A child that ran this long is considered healthy again: its next restart is quick.
HEALTHY_AFTER_SECONDS = 60.0
STOP_GRACE_SECONDS = 20.0
POLL_SECONDS = 0.25


PR_SET_PDEATHSIG = 1


def _own_group_ending_with_parent(parent: int) -> Callable[[], None]:
    """Runs in the child before exec: a session of its own, and SIGTERM if `serve` dies."""

    def setup() -> None:
        os.setsid()
        if sys.platform.startswith("linux"):
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
            if os.getppid() != parent:  # serve died before the request was in place
                os._exit(1)

    return setup


@dataclass
class Child:
    """One supervised command and its current process."""

    name: str
    argv: list[str]
    env: dict[str, str] | None = None
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    restarts: int = field(default=0)

    def start(self) -> None:
        # The signal follows the thread that forks: children are started by the supervisor's
        # own loop, which lives as long as `serve` does.
        setup = _own_group_ending_with_parent(os.getpid())
        self.process = subprocess.Popen(self.argv, env=self.env, preexec_fn=setup)
        self.started_at = time.monotonic()
        self.restart_at = None
        log.info("%s started (pid %d)", self.name, self.process.pid)

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def signal_group(self, sig: int) -> None:
        """Signals the child's whole process group (it is the group's leader)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


class Supervisor:
    """Starts children, restarts any that exit, and stops them all on request."""

    def __init__(
        self,
        children: Sequence[Child],
        *,
        backoff: Sequence[float] = BACKOFF_SECONDS,
        grace_seconds: float = STOP_GRACE_SECONDS,
    ) -> None:
        self.children = list(children)
        self.backoff = backoff
        self.grace_seconds = grace_seconds
        self.stopping = threading.Event()

    def start(self) -> None:
        for child in self.children:
            child.start()

    def check(self) -> None:
        """Notices exited children, clears their groups, restarts them when it is time."""
        now = time.monotonic()
        for child in self.children:
            if child.process is None or child.restart_at is not None:
                if child.restart_at is not None and now >= child.restart_at:
                    child.restarts += 1
                    child.start()
                continue
            code = child.process.poll()
            if code is None:
                continue
            # Whatever the child left behind (an engine core) goes with it.
            child.signal_group(signal.SIGKILL)
            ran = now - child.started_at
            # Failures in a row: a child that had been running fine starts the count over.
            child.failures = 1 if ran >= HEALTHY_AFTER_SECONDS else child.failures + 1
            pause = self.backoff[min(child.failures, len(self.backoff)) - 1]
            child.restart_at = now + pause
            log.warning(
                "%s exited with code %s after %.0f s; restarting in %.0f s",
                child.name,
                code,
                ran,
                pause,
            )

    def run(self, ready: Callable[[], None] | None = None) -> None:
        """Supervises until `stopping` is set (signal handlers set it), then stops all."""
        self.start()
        try:
            if ready is not None:
                ready()
            while not self.stopping.wait(POLL_SECONDS):
                self.check()
        finally:
            self.stop()

    def stop(self) -> None:
        """SIGTERM to every group, then SIGKILL to whatever is left after the grace period."""
        running = [c for c in self.children if c.process and c.process.poll() is None]
        for child in running:
            child.signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace_seconds
        for child in running:
            assert child.process is not None
            try:
                child.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in time: killing it", child.name)
        for child in self.children:
            child.signal_group(signal.SIGKILL)
            if child.process is not None and child.process.poll() is None:
                child.process.wait()

    def handle_signals(self) -> None:
        def _stop(signum: int, _frame: object) -> None:
            if self.stopping.is_set():
                return
            log.info("stopping…")
            self.stopping.set()

        signal.signal(signal.SIGINT, _stop)
        signal.signal(signal.SIGTERM, _stop)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "app.cli", *args]


def online_ports(models: Sequence[str], first: int | None) -> dict[str, int]:
    """`serve --online`: each worker serves its model's online API on the next port."""
    return {} if first is None else {model: first + i for i, model in enumerate(models)}


def children_for(
    settings: Settings,
    models: Sequence[str],
    online: dict[str, int] | None = None,
    engine_args: Sequence[str] = (),
) -> list[Child]:
    """The API and one worker per model, all on the same settings and engine arguments."""
    data_dir = str(Path(settings.data_dir).resolve())
    env = {
        # vLLM's start-up chatter (hundreds of lines) only when asked for.
        "VLLM_LOGGING_LEVEL": "WARNING",
        **os.environ,
        "OVERNIGHT_DATA_DIR": data_dir,
    }
    api = Child(
        "api",
        _cli("api", "--host", settings.host, "--port", str(settings.port), "--data-dir", data_dir),
        env,
    )
    workers = [
        Child(
            f"worker {name}",
            _cli(
                "worker",
                *("--model", name, "--data-dir", data_dir),
                *_online_args(settings, port),
                *engine_args,
            ),
            env if i == 0 else {**env, **_beside_the_first_engine()},
        )
        for i, name in enumerate(models)
        for port in [(online or {}).get(name)]
    ]
    return [api, *workers]


def _beside_the_first_engine() -> dict[str, str]:
    """Where a further CPU engine's threads go: the core vLLM leaves to its front ends.

    Every CPU engine binds its compute threads itself, all to the same cores (vLLM's `auto`
    keeps the last one for schedulers and front ends), so a second engine, idle or not, would
    take its cycles from the first one's. This one runs on the left-over core instead; an
    explicit `VLLM_CPU_OMP_THREADS_BIND` is the user's, and a CUDA engine ignores it.
    """
    cores = sorted(os.sched_getaffinity(0))
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or len(cores) < 2:
        return {}
    return {"VLLM_CPU_OMP_THREADS_BIND": str(cores[-1])}


def _online_args(settings: Settings, port: int | None) -> list[str]:
    return [] if port is None else ["--online-port", str(port), "--online-host", settings.host]


def public_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def ready_line(settings: Settings, models: Sequence[str], since: float) -> str | None:
    """ "ready: N workers serving …" once a worker started since `since` is up for each model."""
    with session_scope(settings) as session:
        workers = monitoring.list_workers(session, settings.lease_seconds)
    up = [
        w
        for w in workers
        if w.worker.started_at >= since and w.state in (WorkerState.IDLE, WorkerState.RUNNING)
    ]
    if not set(models) <= {w.worker.model for w in up}:
        return None
    return f"ready: {len(up)} workers serving {', '.join(sorted({w.worker.model for w in up}))}"


def wait_until_ready(
    url: str, api: Child, stopping: threading.Event, timeout: float = 120.0
) -> bool:
    """Polls `/readyz`; False if asked to stop first. Fails fast if the API has exited."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stopping.is_set():
            return False
        if api.process is not None and api.process.poll() is not None:
            raise RuntimeError(f"the API exited with code {api.process.returncode}")
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the API did not become ready within {timeout:.0f} s")


def banner(
    url: str, models: Sequence[str], open_mode: bool, online: dict[str, int] | None = None
) -> str:
    key = '"anything")  # no keys are configured' if open_mode else 'os.environ["OPENAI_API_KEY"])'
    workers = ", ".join(models) if models else "none (--no-workers)"
    access = "open: no API keys (loopback only)" if open_mode else "API keys required"
    base = url.rsplit(":", 1)[0]
    lines = "".join(
        f"  Online     {base}:{port}/v1 ({model}: chat, completions, responses, embeddings …)\n"
        for model, port in (online or {}).items()
    )
    return f"""
overnight {overnight_version()} is running
  API        {url}/v1
  Access     {access}
  Dashboard  {url}/dashboard
  Workers    {workers} (loading; see {url}/dashboard/workers)
{lines}
Try it with the OpenAI SDK:

  import os
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key={key}
  batch_file = client.files.create(file=open("requests.jsonl", "rb"), purpose="batch")
  batch = client.batches.create(input_file_id=batch_file.id,
                                endpoint="/v1/chat/completions", completion_window="24h")

or: overnight batches submit requests.jsonl --wait

Press Ctrl-C to stop.
"""


def serve(
    settings: Settings,
    models: Sequence[str],
    open_mode: bool,
    online_port: int | None = None,
    engine_args: Sequence[str] = (),
) -> int:
    """Runs the service until Ctrl-C or SIGTERM; returns the exit code."""
    online = online_ports(models, online_port)
    children = children_for(settings, models, online, engine_args)
    supervisor = Supervisor(children)
    supervisor.handle_signals()
    url = public_url(settings)

    started = time.time()

    def announce() -> None:
        try:
            if wait_until_ready(url, children[0], supervisor.stopping):
                print(banner(url, models, open_mode, online), flush=True)
                while models and not supervisor.stopping.wait(1.0):
                    if line := ready_line(settings, models, started):
                        log.info("%s", line)
                        break
        except RuntimeError as exc:
            log.error("%s", exc)
            supervisor.stopping.set()
            raise SystemExit(1) from None

    supervisor.run(announce)
    return 0
