"""`overnight serve` run as a user runs it, in a scratch directory laid out like a checkout.

The docs' example tests (the README's quick start among them) start one: `.venv` linked in,
the run's shared converted models linked into `data/models` (so no test converts SmolLM2
again), a free port, and none of the caller's `OVERNIGHT_*`, `OPENAI_*` or `VLLM_*` variables.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.harness import free_port

REPO = Path(__file__).resolve().parent.parent
BUNDLED_MODELS = {"SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"}
# Below pytest's own timeout (900 s), so that a start that never ends fails with serve's log.
START_TIMEOUT = 600
# How often the tests look again: the banner is a file read, the workers a loopback request.
POLL_SECONDS = 0.2


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    port: int
    log: Path
    workdir: Path
    env: dict[str, str]

    def workers(self) -> list[dict[str, object]]:
        return list(httpx.get(f"{self.url}/v1/admin/workers", timeout=30).json()["data"])

    def live_workers(self) -> dict[str, dict[str, object]]:
        return {str(w["model"]): w for w in self.workers() if w["state"] in ("idle", "running")}


def wait_until(
    what: str, served: Served, condition: Callable[[], bool], timeout: float = START_TIMEOUT
) -> None:
    """Polls `condition` while `serve` runs; fails with the end of its log otherwise."""
    deadline = time.monotonic() + timeout
    while not condition():
        code = served.process.poll()
        assert code is None, f"overnight serve exited with {code}:\n{_log_tail(served)}"
        assert time.monotonic() < deadline, f"{what}:\n{_log_tail(served)}"
        time.sleep(POLL_SECONDS)


def _log_tail(served: Served) -> str:
    """The end of serve's log, and overnight's own lines from before it (vLLM's start-up
    warnings can fill the end)."""
    lines = served.log.read_text(errors="replace").splitlines()
    ours = [line for line in lines[:-100] if " overnight." in line]
    return "\n".join([*ours[-60:], "...", *lines[-100:]])


def user_environment(**settings: str) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OVERNIGHT_", "OPENAI_", "VLLM_"))
    }
    return env | {"OVERNIGHT_LOG_FORMAT": "text"} | settings


@contextmanager
def serving(workdir: Path, models_data_dir: Path, *args: str, **settings: str) -> Iterator[Served]:
    """`overnight serve ARGS` in `workdir` until both bundled models have a live worker;
    Ctrl-C (SIGINT) when the block ends."""
    (workdir / ".venv").symlink_to(REPO / ".venv")
    (workdir / "data").mkdir()
    (workdir / "data" / "models").symlink_to(models_data_dir / "models")
    port = free_port()
    env = user_environment(OVERNIGHT_PORT=str(port), **settings)
    log = workdir / "serve.log"
    overnight = Path(sys.executable).parent / "overnight"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(overnight), "serve", *args],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    running = Served(process, f"http://127.0.0.1:{port}", port, log, workdir, env)
    try:
        wait_until("the banner", running, lambda: "Press Ctrl-C to stop." in log.read_text())
        wait_until("both workers", running, lambda: set(running.live_workers()) == BUNDLED_MODELS)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
