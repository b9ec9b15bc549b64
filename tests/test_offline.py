"""`overnight run-batch`: one file, no server, the service's pipeline and output lines.

Two runs use the real vLLM engine (input GET from a URL, output PUT to one; an engine
process killed mid-run); the resumes after a crash and after a dead engine run run-batch's
own worker loop with the scripted engine, in process.
"""

import argparse
import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from sqlalchemy import select

from app.cli import main
from app.config import ServedModel, Settings
from app.db.models import ResultChunk
from app.db.session import session_scope
from app.offline import runner, state
from app.services.jsonl import iter_lines
from app.storage import storage_for
from tests.engine_fixtures import ENGINE_ARGS, ENGINE_ENV, MODEL, chat_line, jsonl
from tests.fake_engine import FakeEngine
from tests.file_server import Files
from worker import engine as worker_engine
from worker.engine import EngineDeadError
from worker.engine_results import EngineResult

REPO = Path(__file__).resolve().parent.parent


def lines_of(data: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in data.splitlines()]


@pytest.mark.engine
def test_real_engine_from_url_to_url(file_server: str, tmp_path: Path, smollm2: Path) -> None:
    requests = [chat_line(f"q-{i}", f"Name a colour, {i}.", max_tokens=8) for i in range(5)]
    requests.append(chat_line("too-long", max_tokens=10**7))  # the engine refuses it: a 400
    Files.served["/in.jsonl"] = jsonl(requests)
    result = subprocess.run(
        [
            sys.executable, "-m", "app.cli", "run-batch",
            "-i", f"{file_server}/in.jsonl",
            "-o", f"{file_server}/out.jsonl",
            "--error-file", str(tmp_path / "errors.jsonl"),
            "--work-dir", str(tmp_path / "work"),
            "--model", str(smollm2),
            "--served-model-name", MODEL,
            "--output-format", "openai",
            *ENGINE_ARGS,
        ],
        env={**os.environ, **ENGINE_ENV},
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "completed: 5 succeeded, 1 failed of 6" in result.stderr
    outputs = lines_of(Files.received["/out.jsonl"])
    assert sorted(o["custom_id"] for o in outputs) == [f"q-{i}" for i in range(5)]
    for o in outputs:
        assert o["id"].startswith("batch_req_") and o["error"] is None
        assert o["response"]["status_code"] == 200
        assert o["response"]["request_id"].startswith("req_")
        assert o["response"]["body"]["object"] == "chat.completion"
        assert o["response"]["body"]["model"] == MODEL
    [error] = lines_of((tmp_path / "errors.jsonl").read_bytes())
    assert error["custom_id"] == "too-long" and error["response"]["status_code"] == 400
    assert error["response"]["body"]["error"]["message"]


@pytest.mark.engine
def test_a_killed_engine_process_ends_the_run(tmp_path: Path, smollm2: Path) -> None:
    """As the kernel's out-of-memory killer does: vLLM's engine process dies mid-run."""
    source = tmp_path / "in.jsonl"
    story = "Tell a long story about the night shift, number {}."
    # A one-token answer is kept at once; the long ones are still running when it dies.
    stories = [chat_line(f"k-{i}", story.format(i), max_tokens=2000) for i in range(1, 8)]
    source.write_bytes(jsonl([chat_line("k-0", max_tokens=1), *stories]))
    work, log = tmp_path / "work", tmp_path / "stderr.log"
    with log.open("w") as stderr:
        run = subprocess.Popen(
            [
                sys.executable, "-m", "app.cli", "run-batch",
                "-i", str(source), "-o", str(tmp_path / "out.jsonl"), "--work-dir", str(work),
                "--model", str(smollm2), "--served-model-name", MODEL, *ENGINE_ARGS,
            ],
            env={**os.environ, **ENGINE_ENV},
            stderr=stderr,
            cwd=tmp_path,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not (done := persisted(work)):
            assert run.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "no result was recorded"
            time.sleep(0.1)
        [engine] = [p for p in psutil.Process(run.pid).children() if "EngineCore" in p.name()]
        engine.kill()
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
    err = log.read_text()
    assert run.returncode == 1, err[-4000:]
    [said] = [line for line in err.splitlines() if line.startswith("overnight: ")]
    assert said.startswith("overnight: error: the engine stopped (EngineCore"), said
    assert said.endswith(f"run the same command again to resume from {work}"), said
    kept = re.search(r" with (\d) of 8 requests done, which are kept;", said)
    assert kept and len(done) <= int(kept[1]) == len(persisted(work)) < 8, said


def fake_worker(engine: FakeEngine) -> Callable[[Any, str, list[str]], BaseException | None]:
    """Stands in for `runner.run_engine`: run-batch's own worker loop, on a scripted engine
    in place of vLLM's."""

    @asynccontextmanager
    async def scripted(_args: object) -> AsyncIterator[FakeEngine]:
        yield engine

    def run_engine(settings: Any, batch_id: str, engine_argv: list[str]) -> BaseException | None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(worker_engine, "start_engine", scripted)
            return asyncio.run(runner._run_worker(settings, batch_id, argparse.Namespace()))

    return run_engine


class DyingEngine(FakeEngine):
    """Dies, as vLLM's engine does when its process is killed, after answering `lives`."""

    def __init__(self, lives: int) -> None:
        super().__init__(delay=0.05, max_num_seqs=1)
        self.lives = lives

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        if len(self.calls) >= self.lives:
            raise EngineDeadError("EngineCore encountered an issue")
        return await super().run(endpoint, body, request_id)


# The first run, killed midway: the real worker loop with a slow scripted engine.
CRASHING_RUN = """
import sys
import threading
from app.cli import main
from app.offline import runner
from tests.fake_engine import FakeEngine
from tests.test_offline import fake_worker
runner.run_engine = fake_worker(FakeEngine(delay=0.2, max_num_seqs=1))
sys.exit(main(sys.argv[1:]))
"""


def persisted(work: Path) -> dict[str, str]:
    """custom_id -> batch_req id of every result recorded in the work directory."""
    if not (work / state.STATE_FILE).exists():
        return {}  # the run has not created its database yet: do not create it for it
    settings = Settings(data_dir=work, _env_file=None)  # type: ignore[call-arg]
    storage = storage_for(str(settings.storage_dir))
    with session_scope(settings) as session:
        keys = list(session.scalars(select(ResultChunk.storage_key)))
    outputs = (orjson.loads(raw)["output"] for key in keys for _n, raw in iter_lines(storage, key))
    return {o["custom_id"]: o["id"] for o in outputs}


def test_rerun_after_a_crash_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([chat_line(f"r-{i}") for i in range(30)]))
    work, out = tmp_path / "work", tmp_path / "out.jsonl"
    args = ["run-batch", "-i", str(source), "-o", str(out), "--work-dir", str(work)]
    first = subprocess.Popen([sys.executable, "-c", CRASHING_RUN, *args], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while len(before := persisted(work)) < 3:
            assert first.poll() is None, "the first run ended before it could be killed"
            assert time.monotonic() < deadline, "no results were recorded"
            time.sleep(0.05)
        first.kill()  # SIGKILL: no goodbye, the shard stays leased
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    before = persisted(work)
    assert 3 <= len(before) < 30 and not out.exists()

    engine = FakeEngine()
    monkeypatch.setattr(runner, "run_engine", fake_worker(engine))
    assert main([*args, "--keep-work-dir"]) == 0
    everything = lines_of(out.read_bytes())
    assert sorted(o["custom_id"] for o in everything) == sorted(f"r-{i}" for i in range(30))
    assert all(o["response"]["status_code"] == 200 for o in everything)
    # Results persisted before the crash are kept as they were, never run again.
    assert {o["custom_id"]: o["id"] for o in everything if o["custom_id"] in before} == before
    ran = {body["messages"][0]["content"].removeprefix("hello ") for body in engine.bodies()}
    assert not ran & set(before) and len(ran) == 30 - len(before)

    # Once done, running it again only writes the results again; then the work dir goes.
    monkeypatch.setattr(runner, "run_engine", None)
    again = tmp_path / "again.jsonl"
    args[args.index(str(out))] = str(again)
    assert main(args) == 0
    assert again.read_bytes() == out.read_bytes()
    assert not work.exists()


def test_a_dead_engine_ends_the_run_and_the_rerun_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A killed engine (the out-of-memory killer, a crash) ends the run at once with what it
    means, keeping what was done; it once left run-batch waiting forever."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([chat_line(f"d-{i}") for i in range(20)]))
    work, out = tmp_path / "work", tmp_path / "out.jsonl"
    args = ["run-batch", "-i", str(source), "-o", str(out), "--work-dir", str(work)]
    monkeypatch.setattr(runner, "run_engine", fake_worker(DyingEngine(lives=5)))
    started = time.monotonic()
    assert main(args) == 1
    assert time.monotonic() - started < 30
    said = capsys.readouterr().err.splitlines()[-1]
    assert said.startswith("overnight: error: the engine stopped (EngineCore encountered")
    assert said.endswith(f"run the same command again to resume from {work}")
    before = persisted(work)
    assert 1 <= len(before) <= 5 and not out.exists()
    assert re.search(rf"with {len(before)} of 20 requests done, which are kept", said)

    engine = FakeEngine()
    monkeypatch.setattr(runner, "run_engine", fake_worker(engine))
    assert main(args) == 0
    everything = lines_of(out.read_bytes())
    assert sorted(o["custom_id"] for o in everything) == sorted(f"d-{i}" for i in range(20))
    assert {o["custom_id"]: o["id"] for o in everything if o["custom_id"] in before} == before
    assert len(engine.bodies()) == 20 - len(before)


def test_overnight_log_level_shows_the_worker_s_lines(tmp_path: Path) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([chat_line("a")]))
    args = ["run-batch", "-i", str(source), "-o", str(tmp_path / "out.jsonl")]
    args += ["--work-dir", str(tmp_path / "work")]
    script = CRASHING_RUN.replace("delay=0.2, max_num_seqs=1", "")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OVERNIGHT_LOG_")}
    quiet, told = (
        subprocess.run(
            [sys.executable, "-c", script, *args],
            cwd=REPO,
            env={**environ, **level},
            capture_output=True,
            text=True,
            timeout=120,
        )
        for level in ({}, {"OVERNIGHT_LOG_LEVEL": "info", "OVERNIGHT_LOG_FORMAT": "text"})
    )
    assert quiet.returncode == told.returncode == 0, quiet.stderr + told.stderr
    assert "claimed shard" not in quiet.stderr
    assert re.search(r"claimed shard 0 of batch_\w+", told.stderr), told.stderr
    assert re.search(r"shard 0 of batch_\w+: done", told.stderr), told.stderr


def test_bad_input_is_reported_by_line_and_the_fixed_file_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "bad.jsonl"
    good = chat_line("a")
    source.write_bytes(jsonl([good, b"{not json", b'{"method": "POST"}', good]))
    out = tmp_path / "out.jsonl"
    work = tmp_path / "w"
    args = ["run-batch", "-i", str(source), "-o", str(out), "--work-dir", str(work)]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "line 2:" in err and "line 3:" in err  # unparseable, and no custom_id
    assert "line 4:" not in err  # a duplicate custom_id is vLLM's business: it runs both
    assert "Traceback" not in err and not out.exists()
    assert (work / state.STATE_FILE).exists()  # kept after a failure

    # The user mends the file and runs the same command: the new file runs, not the old
    # failed batch again (nor, with another --model, a batch no engine would serve).
    source.write_bytes(jsonl([good, chat_line("b")]))
    engine = FakeEngine()
    monkeypatch.setattr(runner, "run_engine", fake_worker(engine))
    assert main([*args, "--keep-work-dir"]) == 0
    assert "starting over" in capsys.readouterr().err
    assert sorted(o["custom_id"] for o in lines_of(out.read_bytes())) == ["a", "b"]
    assert main([*args, "--model", MODEL]) == 0
    assert "starting over" in capsys.readouterr().err and len(engine.bodies()) == 4


def test_unreadable_input_and_a_reused_work_dir(
    tmp_path: Path, file_server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out.jsonl")
    assert main(["run-batch", "-i", str(tmp_path / "nope.jsonl"), "-o", out]) == 1
    assert "cannot read" in capsys.readouterr().err
    assert main(["run-batch", "-i", f"{file_server}/missing.jsonl", "-o", out]) == 1
    assert "answered 404" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n\n")
    Path(out).write_bytes(b"stale")
    assert main(["run-batch", "-i", str(empty), "-o", out, "--work-dir", str(tmp_path / "w")]) == 0
    assert "no requests" in capsys.readouterr().err and Path(out).read_bytes() == b""
    one = tmp_path / "one.jsonl"
    one.write_bytes(jsonl([chat_line("a"), b"{oops"]))
    work = str(tmp_path / "w2")
    assert main(["run-batch", "-i", str(one), "-o", out, "--work-dir", work]) == 1
    other = tmp_path / "other.jsonl"
    other.write_bytes(jsonl([chat_line("x")]))
    capsys.readouterr()
    assert main(["run-batch", "-i", str(other), "-o", out, "--work-dir", work]) == 1
    assert "use another --work-dir" in capsys.readouterr().err


@pytest.mark.parametrize(
    "options",
    [
        ["--data-dir", "elsewhere"],  # it took the run off its work dir: a run that never ended
        ["--models", "a,b"],
        ["--worker-id", "w1", "--online-port", "9000"],
        ["--window", "4", "--no-dedup", "--health-file", "h.json"],  # ignored before
    ],
)
def test_worker_only_options_are_refused_before_anything_runs(
    tmp_path: Path, options: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_bytes(jsonl([chat_line("a")]))
    work, out = tmp_path / "work", tmp_path / "out.jsonl"
    args = ["run-batch", "-i", str(source), "-o", str(out), "--work-dir", str(work)]
    assert main([*args, *options, "--enforce-eager"]) == 2
    error = capsys.readouterr().err
    flags = [option for option in options if option.startswith("--")]
    assert f"error: {', '.join(flags)}: options of `overnight worker`" in error
    assert not work.exists() and not out.exists()


def test_the_worker_options_run_batch_takes_pass() -> None:
    from app.offline.arguments import worker_only_options

    given = ["--lora-dir", "adapters", "--lora-repo", "org/name", "--enable-log-stats"]
    assert worker_only_options([*given, "--max-model-len", "512", "--enforce-eager"]) == []


def offline_input(tmp_path: Path) -> Path:
    source = tmp_path / "in.jsonl"
    lines = [chat_line("a"), chat_line("streamed", stream=True), chat_line("b"), chat_line("a")]
    source.write_bytes(jsonl(lines))  # a duplicate custom_id: vLLM runs both
    return source


def test_error_lines_are_vllm_s_by_default_and_openai_s_on_request(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.entrypoints.launchers.run_batch import BatchRequestOutput

    monkeypatch.chdir(tmp_path)  # the default work dir is in the current directory
    monkeypatch.setattr(runner, "run_engine", fake_worker(FakeEngine()))
    source, out = offline_input(tmp_path), tmp_path / "out.jsonl"
    assert main(["run-batch", "-i", str(source), "-o", str(out)]) == 0
    lines = lines_of(out.read_bytes())
    assert [o["custom_id"] for o in lines] == ["a", "streamed", "b", "a"]  # the input's order
    for raw in out.read_bytes().splitlines():
        BatchRequestOutput.model_validate_json(raw)
    streamed = lines[1]
    assert streamed["response"]["status_code"] == 400 and streamed["response"]["body"] is None
    assert streamed["error"]["error"]["param"] == "stream"

    errors = tmp_path / "errors.jsonl"
    flags = ["--output-format", "openai", "--error-file", str(errors)]
    assert main(["run-batch", "-i", str(source), "-o", str(out), *flags]) == 0
    assert [o["custom_id"] for o in lines_of(out.read_bytes())] == ["a", "b", "a"]
    [failed] = lines_of(errors.read_bytes())
    assert failed["error"] is None and failed["response"]["body"]["error"]["param"] == "stream"
    assert not any(Path(".overnight-run-batch").iterdir())  # removed after each success


def test_output_is_written_into_the_path_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_engine", fake_worker(FakeEngine()))
    source = offline_input(tmp_path)
    out = tmp_path / "out.jsonl"
    out.write_bytes(b"old contents, longer than nothing\n")
    with out.open("rb") as opened_before:
        assert main(["run-batch", "-i", str(source), "-o", str(out)]) == 0
        assert len(lines_of(opened_before.read())) == 4  # the same file, not a replacement

    previous = os.umask(0o022)
    try:
        fresh = tmp_path / "fresh.jsonl"
        assert main(["run-batch", "-i", str(source), "-o", str(fresh)]) == 0
    finally:
        os.umask(previous)
    assert fresh.stat().st_mode & 0o777 == 0o644

    fifo = tmp_path / "results.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    assert main(["run-batch", "-i", str(source), "-o", str(fifo)]) == 0
    reader.join(30)
    assert len(lines_of(received[0])) == 4


def test_a_dotenv_in_the_working_directory_is_not_the_run_s(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service reads `./.env`; a `run-batch` takes all of its settings from its command."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("OVERNIGHT_LEASE_SECONDS=7\nOVERNIGHT_ADMIN_KEY=sk-admin\n")
    service = Settings()
    assert (service.lease_seconds, service.admin_key) == (7.0, "sk-admin")
    run = runner.offline_settings(tmp_path / "work", ServedModel(name="m", source="m"))
    default_lease = Settings.model_fields["lease_seconds"].default
    assert (run.lease_seconds, run.admin_key) == (default_lease, None)
    assert run.models[0].name == "m" and run.database_url is None
