"""The real API server in a subprocess, for benchmarks: `with api_server(env) as s: s.url`."""

import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.harness import free_port  # noqa: E402


@dataclass(frozen=True)
class ApiServer:
    url: str
    pid: int


@contextmanager
def api_server(
    env: Mapping[str, str],
    log_path: Path | None = None,
    start_timeout: float = 180,
    root: Path = ROOT,
) -> Iterator[ApiServer]:
    """`python -m app.cli api` on a free loopback port, configured only by `env`.

    The caller's own `OVERNIGHT_*` variables are dropped, so `env` says everything.
    `root` is the checkout to run (another one: to compare with an older version).
    """
    port = free_port()
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OVERNIGHT_")}
    full_env.update({"HF_HUB_OFFLINE": "1", "PYTHONPATH": str(root), **env})
    log = log_path.open("wb") if log_path else subprocess.DEVNULL
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "api", "--port", str(port)],
        cwd=root,
        env=full_env,
        stdout=log,
        stderr=log,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                if httpx.get(f"{url}/v1/files", timeout=1).status_code < 500:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the API server did not start")
            time.sleep(0.1)
        yield ApiServer(url, proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        if log_path:
            log.close()  # type: ignore[union-attr]
