"""`overnight batches|files|keys` against a real server, as a person would run them."""

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anthropic
import openai
import orjson
import pytest

from app.cli import main
from app.client.waiting import WaitClock
from app.config import Settings
from app.core.throughput import batch_throughput
from tests.engine_fixtures import MODEL, chat_line, jsonl, start_batch, wait_status
from tests.fake_engine import FakeEngine, ThreadedWorker, fast
from tests.harness import RunningServer, running_server

ADMIN_KEY = "sk-admin-cli-test"

# The commands speak HTTP, answered on both databases in the API tests; `keys` on the
# server machine opens the database itself, so those tests run on both.
pytestmark = pytest.mark.backends("sqlite")


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    with running_server(fast(settings, admin_key=ADMIN_KEY, shard_lines=5)) as running:
        yield running


@pytest.fixture
def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=ADMIN_KEY, max_retries=0)


def run(server: RunningServer, *args: str, key: str = ADMIN_KEY) -> list[str]:
    return [*args, "--base-url", server.base_url, "--api-key", key]


def cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The real command in its own process: exit codes and stderr as a person sees them."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
        cwd=cwd,
    )


def test_submit_wait_downloads_results(server: RunningServer, tmp_path: Path) -> None:
    lines = [chat_line(f"q-{i}", delay=0.05) for i in range(12)]
    lines.append(
        orjson.dumps(
            {
                "custom_id": "bad",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "SmolLM2-135M-Instruct"},
            }
        )
    )
    source = tmp_path / "work.jsonl"
    source.write_bytes(jsonl(lines))
    with ThreadedWorker(server.settings, FakeEngine()):
        result = cli(
            *run(
                server, "batches", "submit", str(source), "--wait", "--metadata", "team=[bold]x[/]"
            ),
            cwd=tmp_path,
        )
    assert result.returncode == 0, result.stderr
    batch_id = result.stdout.strip().splitlines()[0]
    assert batch_id.startswith("batch_")
    assert "Traceback" not in result.stderr
    assert "results saved to work.output.jsonl" in result.stderr
    assert "[bold]x[/]" in result.stderr + result.stdout  # user text printed verbatim
    outputs = [orjson.loads(x) for x in (tmp_path / "work.output.jsonl").read_bytes().splitlines()]
    errors = [orjson.loads(x) for x in (tmp_path / "work.errors.jsonl").read_bytes().splitlines()]
    assert sorted(o["custom_id"] for o in outputs) == sorted(f"q-{i}" for i in range(12))
    assert [e["custom_id"] for e in errors] == ["bad"]
    assert not list(tmp_path.glob(".*.partial"))


def test_list_show_cancel_download_and_files(
    server: RunningServer, sdk: openai.OpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    batch_id = start_batch(sdk, jsonl([chat_line(f"c-{i}") for i in range(7)]), name="c.jsonl")
    wait_status(sdk, batch_id, "in_progress")

    assert main(run(server, "batches", "list", "--json")) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(b["id"], b["status"]) for b in listed] == [(batch_id, "in_progress")]
    assert main(run(server, "batches", "list")) == 0
    assert batch_id in capsys.readouterr().out
    assert main(run(server, "batches", "show", batch_id)) == 0
    shown = capsys.readouterr().out
    assert "in_progress" in shown and "0 ok, 0 failed, 7 total" in shown

    # Not finished: nothing to download yet.
    assert main(run(server, "batches", "download", batch_id)) == 1
    assert "in_progress" in capsys.readouterr().err

    assert main(run(server, "batches", "cancel", batch_id)) == 0
    assert capsys.readouterr().out.strip() in (f"{batch_id} cancelling", f"{batch_id} cancelled")
    wait_status(sdk, batch_id, "cancelled")
    out, err = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    assert (
        main(
            run(
                server, "batches", "download", batch_id, "-o", str(out), "--errors-output", str(err)
            )
        )
        == 0
    )
    assert not out.exists()  # nothing succeeded
    cancelled = [orjson.loads(x) for x in err.read_bytes().splitlines()]
    assert len(cancelled) == 7 and {c["error"]["code"] for c in cancelled} == {"batch_cancelled"}

    assert main(run(server, "files", "list", "--json", "--purpose", "batch_output")) == 0
    files = json.loads(capsys.readouterr().out)
    assert [f["filename"] for f in files] == [f"{batch_id}_error.jsonl"]
    assert main(run(server, "files", "rm", files[0]["id"])) == 0
    assert capsys.readouterr().out.strip() == f"{files[0]['id']} deleted"
    assert main(run(server, "files", "list", "--purpose", "batch_output")) == 0
    assert "No files." in capsys.readouterr().err


def test_errors_are_one_line_and_non_zero(server: RunningServer, tmp_path: Path) -> None:
    wrong = cli(*run(server, "batches", "list", key="sk-wrong"))
    assert wrong.returncode == 1
    assert wrong.stderr.startswith("overnight: error: Incorrect API key provided")
    assert "(HTTP 401)" in wrong.stderr and "Traceback" not in wrong.stderr

    missing = cli(*run(server, "batches", "show", "batch_nope"))
    assert missing.returncode == 1
    assert missing.stderr.strip() == "overnight: error: No such Batch object: batch_nope (HTTP 404)"

    no_file = cli(*run(server, "batches", "submit", str(tmp_path / "nope.jsonl")))
    assert no_file.returncode == 1 and "no such file" in no_file.stderr

    bad = tmp_path / "bad.txt"
    bad.write_text('{"url": "/v1/chat/completions"}\n')
    refused = cli(*run(server, "batches", "submit", str(bad)))
    assert refused.returncode == 1
    assert "Invalid file format for Batch API. Must be .jsonl" in refused.stderr

    closed = cli("files", "list", "--base-url", "http://127.0.0.1:9/v1", "--api-key", "k")
    assert closed.returncode == 1
    assert (
        "cannot reach http://127.0.0.1:9/v1" in closed.stderr and "Traceback" not in closed.stderr
    )


def test_keys_over_http(server: RunningServer, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(run(server, "keys", "create", "--project", "ml", "--name", "nightly")) == 0
    captured = capsys.readouterr()
    secret = captured.out.strip()
    assert secret.startswith("sk-ovn-") and "'ml'" in captured.err
    assert main(run(server, "keys", "list", "--json")) == 0
    keys = json.loads(capsys.readouterr().out)
    assert [(k["project_name"], k["name"]) for k in keys] == [("ml", "nightly")]
    # A member key may not manage keys.
    assert main(run(server, "keys", "list", key=secret)) == 1
    assert "admin key" in capsys.readouterr().err
    assert main(run(server, "keys", "revoke", keys[0]["id"])) == 0
    assert main(run(server, "keys", "list")) == 0
    assert "No API keys" in capsys.readouterr().err


@pytest.mark.backends("sqlite", "postgresql")
def test_keys_on_the_server_machine(settings: Settings, tmp_path: Path) -> None:
    env = {
        "OVERNIGHT_DATABASE_URL": settings.sqlalchemy_url,
        "OVERNIGHT_DATA_DIR": str(settings.data_dir),
        "OPENAI_BASE_URL": "",
    }
    made = cli("keys", "create", "--project", "local", "--role", "admin", env=env, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    listed = cli("keys", "list", "--json", env=env, cwd=tmp_path)
    keys = json.loads(listed.stdout)
    assert [(k["project_name"], k["role"]) for k in keys] == [("local", "admin")]
    with running_server(settings) as server:
        assert openai.OpenAI(base_url=server.base_url, api_key=secret).files.list().data == []
    kept = cli("keys", "revoke", keys[0]["id"], env=env, cwd=tmp_path)
    assert kept.returncode == 1 and "is the last admin key" in kept.stderr
    second = cli("keys", "create", "--project", "local", "--role", "admin", env=env, cwd=tmp_path)
    assert second.returncode == 0
    revoked = cli("keys", "revoke", keys[0]["id"], env=env, cwd=tmp_path)
    assert revoked.returncode == 0
    assert revoked.stdout.startswith(f"{keys[0]['id']} revoked: requests with it now get 401")
    unknown = cli("keys", "revoke", "key_nope", env=env, cwd=tmp_path)
    assert unknown.returncode == 1
    assert unknown.stderr.strip() == "overnight: error: No such API key object: key_nope"


def test_errors_say_what_to_change(server: RunningServer) -> None:
    env = {"OPENAI_API_KEY": ""}
    no_key = cli("batches", "list", "--base-url", server.base_url, env=env)
    assert no_key.returncode == 1
    assert no_key.stderr.strip() == (
        "overnight: error: this deployment needs an API key: pass --api-key or set "
        "OPENAI_API_KEY (HTTP 401)"
    )
    no_v1 = cli("batches", "list", "--base-url", server.url, "--api-key", ADMIN_KEY)
    assert no_v1.returncode == 1
    assert f"is /v1 missing from the base URL? (e.g. {server.url}/v1)" in no_v1.stderr


def test_list_by_status_and_a_failed_batch_downloads_nothing(
    server: RunningServer, sdk: openai.OpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    running = start_batch(sdk, jsonl([chat_line("r-1")]), name="r.jsonl")
    failed = start_batch(sdk, b'{"not": "a request"}\n', name="f.jsonl")
    wait_status(sdk, running, "in_progress")
    wait_status(sdk, failed, "failed")

    assert main(run(server, "batches", "list", "--status", "failed", "--json")) == 0
    assert [b["id"] for b in json.loads(capsys.readouterr().out)] == [failed]
    assert main(run(server, "batches", "list", "--status", "completed")) == 0
    assert "No completed batches." in capsys.readouterr().err

    assert main(run(server, "batches", "download", failed)) == 1
    assert f"`overnight batches show {failed}` lists its errors" in capsys.readouterr().err

    assert main(run(server, "batches", "show", running)) == 0
    shown = capsys.readouterr().out.splitlines()
    assert not any(line.strip() in ("output file", "error file") for line in shown), "no empty rows"
    [created] = [line for line in shown if line.startswith("created")]
    assert created.split()[-1] == time.strftime("%Z"), "timestamps carry their zone"


def test_message_batches_are_listed_shown_and_downloaded_beside_openai_ones(
    server: RunningServer, sdk: openai.OpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    openai_batch = start_batch(sdk, jsonl([chat_line("o-1")]), name="o.jsonl")
    hello = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]}
    with anthropic.Anthropic(base_url=server.url, api_key=ADMIN_KEY, max_retries=0) as claude:
        created = claude.messages.batches.create(requests=[{"custom_id": "m-1", "params": hello}])
    with ThreadedWorker(server.settings, FakeEngine()):
        wait_status(sdk, created.id, "completed")

    assert main(run(server, "batches", "list")) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:2] == ["ID", "API"]
    assert {tuple(row.split()[:2]) for row in listed[1:]} == {
        (created.id, "anthropic"),
        (openai_batch, "openai"),
    }
    assert main(run(server, "batches", "show", created.id)) == 0
    shown = capsys.readouterr().out
    assert re.search(r"^api\s+anthropic\s*$", shown, re.M) and "1 ok, 0 failed, 1 total" in shown
    out = tmp_path / "m.jsonl"
    assert main(run(server, "batches", "download", created.id, "-o", str(out))) == 0
    [result] = [orjson.loads(x) for x in out.read_bytes().splitlines()]
    assert result["custom_id"] == "m-1"
    assert result["response"]["body"]["content"] == [{"type": "text", "text": "olleh"}]


@pytest.mark.backends("sqlite", "postgresql")
def test_the_first_key_keeps_open_mode_work_in_view(settings: Settings, tmp_path: Path) -> None:
    env = {
        "OVERNIGHT_DATABASE_URL": settings.sqlalchemy_url,
        "OVERNIGHT_DATA_DIR": str(settings.data_dir),
        "OPENAI_BASE_URL": "",
    }
    with running_server(settings) as server:
        open_sdk = openai.OpenAI(base_url=server.base_url, api_key="anything")
        made_open = open_sdk.files.create(file=("a.jsonl", b"{}\n"), purpose="batch").id
        first = cli("keys", "create", "--role", "admin", env=env, cwd=tmp_path)
        assert first.returncode == 0, first.stderr
        assert "for project 'default'" in first.stderr and "note:" not in first.stderr
        keyed = openai.OpenAI(base_url=server.base_url, api_key=first.stdout.strip())
        assert [f.id for f in keyed.files.list().data] == [made_open]
    other = cli("keys", "create", "--project", "research", env=env, cwd=tmp_path)
    assert other.returncode == 0
    assert "what was made without keys is in project 'default'" in other.stderr


def _follow(command: list[str], cwd: Path) -> tuple[subprocess.Popen[str], "queue.Queue[str]"]:
    """The real command in its own process, its stderr lines readable as they come."""
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stderr is not None
    stderr = process.stderr
    threading.Thread(target=lambda: [lines.put(line) for line in stderr], daemon=True).start()
    return process, lines


def _next_line_with(lines: "queue.Queue[str]", text: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if text in line:
            return line
    raise AssertionError(f"no line with {text!r} in {timeout} s")


def test_wait_says_waiting_for_a_worker_and_leaves_it_out_of_throughput(
    server: RunningServer, sdk: openai.OpenAI, tmp_path: Path
) -> None:
    source = tmp_path / "first.jsonl"
    source.write_bytes(jsonl([chat_line(f"w-{i}") for i in range(6)]))
    submit = run(server, "batches", "submit", str(source), "--wait", "--interval", "0.2")
    started = time.monotonic()
    process, lines = _follow(submit, tmp_path)
    try:
        said = _next_line_with(lines, "waiting for a worker")
        assert "no worker serves SmolLM2-135M-Instruct yet" in said
        held = 5.0  # the engine's "first start": the batch is in progress, nothing serves it
        time.sleep(held)
        with ThreadedWorker(server.settings, FakeEngine()):
            out, _ = process.communicate(timeout=300)
        ran = time.monotonic() - started
    finally:
        process.kill()
    assert process.returncode == 0
    batch = sdk.batches.list(limit=1).data[0]
    assert batch.status == "completed" and batch.usage is not None
    [row] = [line for line in out.splitlines() if line.startswith("throughput")]
    found = re.search(r"([\d.]+) tok/s \(waited (\d+) s for a worker, left out\)", row)
    assert found, row
    rate, waited = float(found[1]), int(found[2])
    # The clock runs from the first poll that saw the batch waiting to the last one, so on a
    # busy machine a slow poll (seen: 1.5 s) shortens it; it never runs past the whole command.
    assert held - 3 <= waited <= ran
    over_its_whole_run = batch_throughput(
        batch, time.time(), input_tokens=0, output_tokens=batch.usage.output_tokens, completed=0
    )
    assert rate > over_its_whole_run.per_second


def test_the_wait_clock_counts_between_the_polls_that_saw_the_batch_waiting() -> None:
    clock = WaitClock()
    for now, waiting in [(10.0, False), (11.0, True), (12.5, True), (14.0, True)]:
        clock.saw(waiting, now)
    assert clock.seconds == 3.0  # still waiting: counted up to the last poll, not to now
    for now, waiting in [(16.0, False), (20.0, True), (21.0, True), (22.0, False)]:
        clock.saw(waiting, now)
    # Two waits; the polls that saw a worker serving (16.0, 22.0) add nothing.
    assert clock.seconds == 4.0
