"""The README's quick start, run as written against `overnight serve` on the embedded default.

Every ```bash and ```python block of the "Quick start" section runs in order in a scratch
directory (with `.venv` linked in, as in a checkout). The one change: the service listens
on a free port (OVERNIGHT_PORT), so `127.0.0.1:8000` in the blocks is replaced by it.
Afterwards the same `overnight serve` shows that a killed worker is replaced, its engine
processes with it, and that Ctrl-C stops everything. The data directory starts with the
bundled SmolLM2 already converted (the run's shared copy: `models_data_dir` converts it
with the same `ensure_converted`), so the run converts it once, not once more here.
"""

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil
import pytest

from tests.serve_process import REPO, Served, serving, wait_until

README = REPO / "README.md"

pytestmark = pytest.mark.engine


def quickstart_blocks() -> list[tuple[str, str]]:
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"^```(bash|python)\n(.*?)^```", section, re.S | re.M)


@pytest.fixture(scope="module")
def served(models_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    with serving(tmp_path_factory.mktemp("readme"), models_data_dir) as running:
        yield running


def test_banner_shows_the_way_in(served: Served) -> None:
    text = served.log.read_text()
    assert f"API        {served.url}/v1" in text
    assert f"Dashboard  {served.url}/dashboard" in text
    assert f'client = OpenAI(base_url="{served.url}/v1", api_key="anything")' in text
    assert (served.workdir / "data" / "overnight.db").exists()  # the embedded default


def test_quickstart_blocks_run_as_written(served: Served) -> None:
    blocks = quickstart_blocks()
    assert [kind for kind, _ in blocks].count("python") >= 1
    assert sum("curl" in code for kind, code in blocks if kind == "bash") >= 1
    outputs = []
    for kind, code in blocks:
        code = code.replace("127.0.0.1:8000", f"127.0.0.1:{served.port}")
        command = ["bash", "-euo", "pipefail", "-c", code]
        if kind == "python":
            command = [sys.executable, "-c", code]
        result = subprocess.run(
            command, cwd=served.workdir, env=served.env, capture_output=True, text=True, timeout=900
        )
        assert result.returncode == 0, (
            f"{kind} block failed:\n{code}\n{result.stdout}\n{result.stderr}"
        )
        outputs.append((kind, code, result.stdout))

    def ids_in(text: str) -> set[str]:
        found = set()
        for line in text.splitlines():
            if line.startswith('{"id":"batch_req_'):
                record = orjson.loads(line)
                assert record["response"]["status_code"] == 200 and record["error"] is None
                found.add(record["custom_id"])
        return found

    sdk = next(out for kind, _c, out in outputs if kind == "python")
    assert "completed" in sdk and ids_in(sdk) == {"greet", "haiku", "count"}
    curl = next(out for kind, code, out in outputs if "curl" in code)
    assert ids_in(curl) == {"greet", "haiku", "count"}
    cli = (served.workdir / "requests.output.jsonl").read_text()
    assert ids_in(cli) == {"greet", "haiku", "count"}
    embeddings = [
        orjson.loads(x) for x in (served.workdir / "embeddings.jsonl").read_bytes().splitlines()
    ]
    assert sorted(e["custom_id"] for e in embeddings) == ["e1", "e2"]
    assert len(embeddings[0]["response"]["body"]["data"][0]["embedding"]) == 384
    offline = (served.workdir / "results.jsonl").read_text()
    assert ids_in(offline) == {"greet", "haiku", "count"}


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _outliving(processes: list[psutil.Process], seconds: float) -> list[int]:
    """The pids of `processes` still running `seconds` from now; as soon as none is, none."""
    deadline = time.monotonic() + seconds
    while (alive := [p.pid for p in processes if _running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _pinned_cores(pid: int) -> set[int]:
    """The cores that threads of `pid`'s engine processes are pinned to one by one: where vLLM
    bound its compute threads."""
    cores: set[int] = set()
    for process in _descendants(pid):
        for thread in process.threads():
            try:
                allowed = os.sched_getaffinity(thread.id)
            except OSError:  # the thread ended meanwhile
                continue
            if len(allowed) == 1:
                cores |= allowed
    return cores


def test_each_engine_computes_on_cores_of_its_own(served: Served) -> None:
    """The idle embedding engine takes no cycles from the chat engine's cores (issue 16)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: there is nothing to share out")
    workers = served.live_workers()
    chat = _pinned_cores(int(str(workers["SmolLM2-135M-Instruct"]["pid"])))
    embedding = _pinned_cores(int(str(workers["all-MiniLM-L6-v2"]["pid"])))
    assert chat and embedding, (chat, embedding)
    assert not chat & embedding, (chat, embedding)
    assert max(os.sched_getaffinity(0)) in embedding


def test_a_killed_worker_is_replaced_then_ctrl_c_stops_all(served: Served) -> None:
    chat = served.live_workers()["SmolLM2-135M-Instruct"]
    old_pid = int(str(chat["pid"]))
    engine = _descendants(old_pid)
    assert engine, "the worker runs vLLM's engine core in child processes"
    os.kill(old_pid, signal.SIGKILL)
    assert _outliving(engine, 60) == [], "the dead worker's engine processes survived"
    wait_until(
        "a new chat worker",
        served,
        lambda: (
            int(str(served.live_workers().get("SmolLM2-135M-Instruct", {}).get("pid", old_pid)))
            != old_pid
        ),
    )
    everything = _descendants(served.process.pid)
    served.process.send_signal(signal.SIGINT)
    assert served.process.wait(90) == 0
    assert _outliving(everything, 1) == [], "processes outlived `overnight serve`"
