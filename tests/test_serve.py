"""`overnight serve`: children in their own process groups, restarted when they die, stopped.

The real engine under `overnight serve` is exercised by tests/test_docs.py; here the
supervision itself runs with small stand-in children, and `serve --no-workers` end to end.
"""

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import orjson
import psutil
from sqlalchemy import update

from app.config import Settings
from app.db.models import RegisteredWorker
from app.db.session import session_scope, upgrade
from app.supervisor import Child, Supervisor, children_for, ready_line
from tests.harness import free_port
from worker import registry

# A child that starts a grandchild (as a worker starts vLLM's engine core) and records both.
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(sys.argv[1], "a") as f:
        f.write(f"{os.getpid()} {grandchild.pid}\\n")
    time.sleep(600)
    """
)


def wait_for(condition: Callable[[], bool], timeout: float = 30, what: str = "it") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def recorded(path: Path) -> list[tuple[int, int]]:
    if not path.exists():
        return []
    pairs = [line.split() for line in path.read_text().splitlines()]
    return [(int(a), int(b)) for a, b in pairs]


def test_a_dead_child_is_restarted_and_its_group_cleared(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    child = Child("worker", [sys.executable, "-c", PARENT, str(pids)])
    supervisor = Supervisor([child], backoff=(0.1,), grace_seconds=5)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: len(recorded(pids)) == 1, what="the first child")
        first, first_grandchild = recorded(pids)[0]
        assert os.getpgid(first) == first and os.getpgid(first_grandchild) == first
        assert os.getpgid(first) != os.getpgid(0)  # not in the supervisor's group

        os.kill(first, signal.SIGKILL)  # the worker dies; its engine child is left behind
        wait_for(lambda: len(recorded(pids)) == 2, what="the restart")
        second, second_grandchild = recorded(pids)[1]
        assert second != first and child.restarts == 1
        wait_for(lambda: not alive(first_grandchild), what="the orphan to be killed")
        assert alive(second) and alive(second_grandchild)
    finally:
        supervisor.stopping.set()
        thread.join(30)
    assert not thread.is_alive()
    assert not alive(second)
    wait_for(lambda: not alive(second_grandchild), timeout=5, what="the group to be gone")


def test_backoff_grows_for_a_child_that_keeps_failing(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    record_start = f"import time; open({str(starts)!r}, 'a').write(f'{{time.monotonic()}}\\n')"
    child = Child("api", [sys.executable, "-c", record_start])
    supervisor = Supervisor([child], backoff=(0.05, 0.5, 60), grace_seconds=1)
    thread = threading.Thread(target=supervisor.run, daemon=True)
    thread.start()
    try:
        # Timed by the starts themselves: on a busy machine one Python start can take a second.
        wait_for(lambda: child.failures == 3, what="three failed starts")
        time.sleep(1.0)
    finally:
        supervisor.stopping.set()
        thread.join(10)
    # Starts at 0, then after 0.05 s, then after 0.5 s; the next pause is a minute.
    first, second, third = (float(t) for t in starts.read_text().split())
    assert second - first >= 0.05 and third - second >= 0.5
    assert child.failures == 3


def test_serve_without_workers_prints_the_way_in_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "OVERNIGHT_DATA_DIR": str(tmp_path / "data"),
        "OVERNIGHT_DATABASE_URL": "",
    }
    env.pop("OVERNIGHT_ADMIN_KEY", None)
    env.pop("OVERNIGHT_LOG_FORMAT", None)
    logs = tmp_path / "stderr.log"
    serve = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--no-workers"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=logs.open("w"),
        text=True,
    )
    try:
        banner: list[str] = []
        assert serve.stdout is not None
        for line in serve.stdout:
            banner.append(line)
            if "Press Ctrl-C" in line:
                break
        text = "".join(banner)
        url = f"http://127.0.0.1:{port}"
        assert f"API        {url}/v1" in text
        assert f"Dashboard  {url}/dashboard" in text
        assert f'OpenAI(base_url="{url}/v1"' in text
        assert "Access     open: no API keys (loopback only)" in text
        ready = httpx.get(f"{url}/readyz")
        assert ready.status_code == 200 and ready.json()["access"] == "open"
        assert httpx.get(f"{url}/dashboard").status_code == 200
        assert httpx.get(f"{url}/dashboard/api/batches").status_code == 200
        assert httpx.get(f"{url}/v1/models").status_code == 200
        api = [p for p in psutil.Process(serve.pid).children() if "api" in p.cmdline()]
        assert len(api) == 1
        serve.send_signal(signal.SIGINT)
        assert serve.wait(30) == 0
        assert not alive(api[0].pid)
        assert (tmp_path / "data" / "overnight.db").exists()
        # Not a terminal: the log stream is JSON lines only, polling and probes left out.
        entries = [orjson.loads(line) for line in logs.read_text().splitlines() if line]
        paths = [e["path"] for e in entries if e["logger"] == "overnight.access"]
        assert paths == ["/dashboard", "/v1/models"]
        assert sum("open" in e["message"] for e in entries if e["level"] == "warning") == 1
        assert not any("\x1b[" in str(e) for e in entries)
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()


def test_a_sigkilled_serve_takes_its_children_with_it(tmp_path: Path) -> None:
    env = {**os.environ, "OVERNIGHT_DATA_DIR": str(tmp_path / "data"), "OVERNIGHT_DATABASE_URL": ""}
    env.pop("OVERNIGHT_ADMIN_KEY", None)
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())]
    serve = subprocess.Popen(
        [*command, "--no-workers"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        children: list[psutil.Process] = []

        def started() -> bool:
            children[:] = psutil.Process(serve.pid).children()
            return bool(children)

        wait_for(started, what="serve's API child")
        os.kill(serve.pid, signal.SIGKILL)  # no handler runs: the kernel tells the children
        serve.wait(10)
        for child in children:
            wait_for(lambda c=child: not alive(c.pid), timeout=30, what=f"{child.pid} to exit")  # type: ignore[misc]
    finally:
        for child in children:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()


def test_ready_line_waits_for_a_fresh_worker_of_each_model(settings: Settings) -> None:
    upgrade(settings.sqlalchemy_url)
    since = time.time()
    with session_scope(settings) as session:
        registry.register(session, "old", "chat-model")
        session.execute(
            update(RegisteredWorker)
            .where(RegisteredWorker.id == "old")
            .values(started_at=since - 60)
        )
    assert ready_line(settings, ["chat-model", "embed-model"], since) is None
    with session_scope(settings) as session:
        registry.register(session, "w-chat", "chat-model")
    assert ready_line(settings, ["chat-model", "embed-model"], since) is None
    with session_scope(settings) as session:
        registry.register(session, "w-embed", "embed-model")
    line = ready_line(settings, ["chat-model", "embed-model"], since)
    assert line == "ready: 2 workers serving chat-model, embed-model"


def test_serve_online_gives_each_worker_its_own_online_port(tmp_path: Path) -> None:
    from app.supervisor import banner, children_for, online_ports

    settings = Settings(data_dir=tmp_path, _env_file=None)  # type: ignore[call-arg]
    models = ["SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]
    online = online_ports(models, 8001)
    assert online == {"SmolLM2-135M-Instruct": 8001, "all-MiniLM-L6-v2": 8002}
    _api, *workers = children_for(settings, models, online)
    for worker, port in zip(workers, (8001, 8002), strict=True):
        flag = worker.argv.index("--online-port")
        assert worker.argv[flag + 1 : flag + 4] == [str(port), "--online-host", "127.0.0.1"]
    assert all("--online-port" not in w.argv for w in children_for(settings, models)[1:])
    text = banner("http://127.0.0.1:8000", models, True, online)
    assert "Online     http://127.0.0.1:8002/v1 (all-MiniLM-L6-v2" in text


def test_serve_checks_the_workers_engine_arguments_before_starting(tmp_path: Path) -> None:
    """`serve` passes every other argument to its workers, as vLLM's parser takes it; a bad one
    or a model ends it before it creates anything (tests/test_docs.py runs the good case)."""
    env = {**os.environ, "OVERNIGHT_DATA_DIR": str(tmp_path / "data"), "OVERNIGHT_DATABASE_URL": ""}
    command = [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())]
    refused = {
        "--max-num-seqs many": "argument --max-num-seqs: invalid int value: 'many'",
        "--model other": "a model is not an engine argument",
        "other-model --enforce-eager": "a model is not an engine argument",
    }
    for arguments, message in refused.items():
        result = subprocess.run(
            [*command, *arguments.split()], env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode != 0, arguments
        assert message in result.stderr, result.stderr[-2000:]
        assert "overnight serve" in result.stderr
        assert not (tmp_path / "data").exists(), "nothing is created before the check"


def test_serve_gives_every_worker_its_engine_arguments_and_the_api_none(settings: Settings) -> None:
    engine_args = ["--enforce-eager", "--max-num-seqs", "4"]
    api, *workers = children_for(settings, ["chat", "embed"], {"chat": 8001}, engine_args)
    assert [w.name for w in workers] == ["worker chat", "worker embed"]
    for worker in workers:
        assert worker.argv[-3:] == engine_args
        assert worker.argv[worker.argv.index("--model") + 1] in ("chat", "embed")
    assert "--online-port" in workers[0].argv and "--online-port" not in workers[1].argv
    assert not set(engine_args) & set(api.argv)
