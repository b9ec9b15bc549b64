"""The documentation site: it builds strictly, it names every setting, command and error code
the code has, and every example of Getting started and the guides runs as written against one
real `overnight serve` (Python, shell, and Node.js with the official `openai` npm package).

The README's quick start runs as written against the same `overnight serve` afterwards, in a
scratch checkout of its own (the one change in its blocks: the service's free port in place
of `127.0.0.1:8000`). That server was started with the online guide's `--online`, which the
quick start neither needs nor minds: one server, not two, each with an engine per bundled
model. Last, the same `overnight serve` shows that a killed worker is replaced, its engine
processes with it, and that Ctrl-C stops everything. Its data directory starts with the
bundled SmolLM2 already converted (the run's shared copy: `models_data_dir`).
"""

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import pytest

from app.cli import build_parser
from app.config import Settings
from tests.doc_blocks import DOCS, REPO, RUNNABLE, Block, Ran, blocks, example_pages, run
from tests.harness import free_port
from tests.serve_process import Served, serving, wait_until
from worker.cli import own_parser

# Blocks a reader runs elsewhere or not at all, by page and first line; every other block
# of the example pages runs.
NOT_RUN = {
    ("getting-started.md", "bash docker/install.sh && .venv/bin/overnight serve"),
    ("guides/run-batch.md", ".venv/bin/overnight run-batch -i requests.jsonl"),
    ("guides/run-batch.md", "overnight run-batch -i prompts.jsonl -o results.jsonl"),
    ("guides/webhooks.md", "OVERNIGHT_WEBHOOK_ALLOW_PRIVATE=1 .venv/bin/overnight serve"),
    ("guides/online.md", ".venv/bin/overnight serve --online"),
    ("guides/scaling-out.md", "export AWS_ACCESS_KEY_ID=minioadmin"),
    ("guides/docker.md", "cp docker/.env.example docker/.env"),
    ("guides/kubernetes.md", "cp docker/kubernetes/secrets.env.example"),
}
DOCUMENTED_PORT, DOCUMENTED_ONLINE_PORT = "127.0.0.1:8000", "127.0.0.1:8001"
SHARED_OPTIONS = {"--help", "--base-url", "--api-key", "--json"}


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    env = os.environ | {"NO_MKDOCS_2_WARNING": "1"}
    mkdocs = Path(sys.executable).parent / "mkdocs"
    result = subprocess.run(
        [str(mkdocs), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()


def test_the_readme_is_short_and_its_links_lead_somewhere() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert "bash docker/install.sh && .venv/bin/overnight serve" in readme
    assert "bash docker/install.sh --dev && .venv/bin/python -m pytest" in readme
    assert ".venv/bin/mkdocs serve" in readme
    links = re.findall(r"\]\(((?:docs/|CHANGELOG)[^)#]*)", readme)
    assert len(links) >= 20
    assert [link for link in links if not (REPO / link).is_file()] == []


def _documented_default(env_name: str, page: str) -> str | None:
    """The default cell of the setting's own table row (its first code span), or None."""
    row = next((line for line in page.splitlines() if line.startswith(f"| `{env_name}` |")), "")
    if not row:
        return None
    default = row.split("|")[2].strip()
    found = re.match(r"`([^`]+)`", default)
    return found[1] if found else default


def _rendered(value: Any) -> Any:
    """A default as the page writes it: JSON for numbers, lists and maps, `unset` for None."""
    if value is None:
        return "unset"
    if isinstance(value, Path | str):
        return str(value.value if hasattr(value, "value") else value)
    if hasattr(value, "model_dump"):
        return None  # a model (the served models): described in words
    return value


def test_every_setting_is_documented_with_its_default() -> None:
    page = (DOCS / "reference" / "configuration.md").read_text()
    wrong = {}
    for name, field in Settings.model_fields.items():
        env_name = f"OVERNIGHT_{name.upper()}"
        documented = _documented_default(env_name, page)
        default = field.get_default(call_default_factory=True)
        if documented is None:
            wrong[env_name] = ("no row", default)
            continue
        expected = _rendered(default)
        if isinstance(default, list) and default and hasattr(default[0], "model_dump"):
            continue  # OVERNIGHT_MODELS: its row names the bundled models
        if isinstance(default, Path):
            matches = Path(documented) == default
        elif isinstance(expected, str):
            matches = documented == expected
        else:
            try:
                matches = json.loads(documented) == expected
            except json.JSONDecodeError:
                matches = False
        if not matches:
            wrong[env_name] = (documented, default)
    assert wrong == {}, "documented default differs from app/config.py"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[Any]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _long_options(parser: argparse.ArgumentParser) -> set[str]:
    return {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--")
    } - SHARED_OPTIONS


def _unit(page: str, command: str) -> str:
    """A command's heading section, or else its table row."""
    heading = re.search(rf"^### {re.escape(command)}\n(.*?)(?=^#|\Z)", page, re.S | re.M)
    if heading:
        return heading[1]
    row = re.compile(rf"^\| `{re.escape(command)}[ `]")
    return next((line for line in page.splitlines() if row.match(line)), "")


def test_every_command_and_option_is_documented() -> None:
    page = (DOCS / "reference" / "cli.md").read_text()
    missing: dict[str, set[str]] = {}
    commands = dict(_commands(build_parser()))
    assert len(commands) > 30
    for path, parser in commands.items():
        if parser._subparsers is not None:
            continue  # a group: its commands are checked one by one
        command = "overnight " + " ".join(path)
        options = own_parser()._actions if path == ("worker",) else parser._actions
        wanted = {o for a in options for o in a.option_strings if o.startswith("--")}
        unit = _unit(page, command)
        absent = {o for o in wanted - SHARED_OPTIONS if o not in unit}
        if not unit or absent:
            missing[command] = absent or {"(no section or row)"}
    assert missing == {}


# Where the code writes an error code: `code="…"`, a constant, or a code passed beside its
# message (`("code", "Message …")`).
ERROR_CODE = re.compile(
    r"""code(?::\s*str)?\s*=\s*"([a-z0-9_]+)"|_error\(\s*"([a-z0-9_]+)"|"""
    r"""\(\s*"([a-z0-9_]+)",\s*f?"[A-Z]|"([a-z0-9_]+_too_large)"|"""
    r"""^[A-Z_]*(?:CODE|MISSING) = "([a-z0-9_]+)"$""",
    re.M,
)


def _error_codes() -> set[str]:
    codes: set[str] = set()
    for module in [*(REPO / "app").rglob("*.py"), *(REPO / "worker").rglob("*.py")]:
        if module.name in ("message_batches.py", "message_batch_results.py"):
            continue  # Anthropic's Message Batches: their page comes with them
        for match in ERROR_CODE.finditer(module.read_text()):
            codes.add(next(group for group in match.groups() if group))
    return codes


def test_every_error_code_is_documented() -> None:
    page = (DOCS / "reference" / "errors.md").read_text()
    # Beside codes the pattern also meets metric names and timestamps (`("created_at", "…")`).
    codes = {
        code
        for code in _error_codes()
        if "_" in code and not code.startswith("overnight_") and not code.endswith("_at")
    }
    assert {"invalid_utf8", "model_endpoint_mismatch", "batch_cancelled", "quota_exceeded"} <= (
        codes
    )
    assert {code for code in codes if f"`{code}`" not in page} == set()


def test_the_architecture_table_names_every_package_and_module() -> None:
    page = (DOCS / "architecture.md").read_text()
    packages = [f"app/{p.name}/" for p in (REPO / "app").iterdir() if (p / "__init__.py").exists()]
    modules = [f"app/{p.name}" for p in (REPO / "app").glob("*.py") if p.name != "__init__.py"]
    named = [*packages, *modules, "worker/", "migrations/"]
    assert [name for name in named if f"`{name}`" not in page] == []


def test_blocks_not_run_are_exactly_the_intended_ones() -> None:
    pages = example_pages()
    assert pages[:2] == ["getting-started.md", "guides/openai-python.md"]
    assert {p.relative_to(DOCS).as_posix() for p in (DOCS / "guides").glob("*.md")} <= set(pages)
    every = [block for page in pages for block in blocks(page)]
    skipped = {(b.page, b.first_line) for b in every if b.skip_reason}
    matched = {
        (p, s) for p, s in NOT_RUN for page, line in skipped if (page, line[: len(s)]) == (p, s)
    }
    assert matched == NOT_RUN and len(skipped) == len(NOT_RUN), skipped
    assert [(b.page, b.kind) for b in every if not b.skip_reason and b.kind not in RUNNABLE] == []
    assert {b.kind for b in every if not b.skip_reason} == RUNNABLE


def test_the_run_batch_guides_example_is_the_quick_starts() -> None:
    """Not run twice: the command is the README quick start's, on the same requests.jsonl, and
    runs there (an engine start of its own, 85 s of the suite)."""
    example = next(b for b in blocks("guides/run-batch.md") if "quick start" in str(b.skip_reason))
    quick_start = "".join(code for kind, code in quickstart_blocks() if kind == "bash")
    assert example.first_line in quick_start.splitlines()
    getting_started = next(b for b in blocks("getting-started.md") if "cat > requests" in b.code)
    assert getting_started.code.replace("JSONL", "EOF") in quick_start


def _npm_reachable() -> str | None:
    """Why the npm registry cannot be used here, or None."""
    if shutil.which("npm") is None or shutil.which("node") is None:
        return "node and npm are not installed"
    try:
        result = subprocess.run(
            ["npm", "view", "openai", "version"], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return "the npm registry did not answer within 60 s"
    return None if result.returncode == 0 else f"npm view openai failed: {result.stderr[-300:]}"


def _results(text: str) -> dict[str, dict[str, Any]]:
    lines = [
        orjson.loads(line) for line in text.splitlines() if line.startswith('{"id":"batch_req_')
    ]
    return {line["custom_id"]: line for line in lines}


def _all_ok(text: str, ids: set[str]) -> None:
    """Exactly these custom_ids, each answered (status 200, no error)."""
    results = _results(text)
    assert set(results) == ids, sorted(results)
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in results.values())


QUICK = {"greet", "haiku", "count"}


def _getting_started(ran: list[Ran], workdir: Path) -> None:
    sdk = next(r.stdout for r in ran if r.block.kind == "python")
    assert "completed" in sdk and set(_results(sdk)) == QUICK
    _all_ok((workdir / "requests.output.jsonl").read_text(), QUICK)


def _python(ran: list[Ran], workdir: Path) -> None:
    first, upload, listed, embeddings = (r.stdout for r in ran)
    assert first.startswith("completed") and all(f"{i} -> " in first for i in QUICK)
    assert upload.startswith("completed file-")
    assert "estimated_finish_at" in listed and ("cancelling" in listed or "cancelled" in listed)
    assert embeddings.split() == ["doc-0", "384", "doc-1", "384", "doc-2", "384"]


def _node(ran: list[Ran], workdir: Path) -> None:
    output = ran[-1].stdout
    assert output.startswith("completed") and all(f"{i} -> " in output for i in QUICK)


def _curl(ran: list[Ran], workdir: Path) -> None:
    _all_ok((workdir / "curl.output.jsonl").read_text(), QUICK)
    assert '"status":"completed"' in ran[2].stdout  # the upload
    assert "HTTP/1.1 404" in ran[3].stdout and "x-should-retry: false" in ran[3].stdout


def _cli(ran: list[Ran], workdir: Path) -> None:
    _all_ok((workdir / "cli.output.jsonl").read_text(), QUICK)
    saga = [orjson.loads(x) for x in (workdir / "saga.errors.jsonl").read_bytes().splitlines()]
    assert [(e["custom_id"], e["error"]["code"]) for e in saga] == [("saga", "batch_cancelled")]
    embedded = _results((workdir / "embeddings.jsonl").read_text())
    assert len(embedded["e1"]["response"]["body"]["data"][0]["embedding"]) == 384


def _webhooks(ran: list[Ran], workdir: Path) -> None:
    assert ran[0].stdout.splitlines() == [
        "test event: batch.completed batch_test",
        "batch.completed True",
    ]
    assert "deleted" in ran[1].stdout.splitlines()[-1]


def _scheduling(ran: list[Ran], workdir: Path) -> None:
    assert ran[0].stdout.startswith("default: weight 2")
    assert "10,000,000 tokens (own)" in ran[1].stdout
    assert "1,000 files (own)" in ran[2].stdout


def _online(ran: list[Ran], workdir: Path) -> None:
    assert "data: [DONE]" in ran[0].stdout
    assert "CompletionUsage(completion_tokens=" in ran[1].stdout


def _anthropic(ran: list[Ran], workdir: Path) -> None:
    message_batch, openai_batch = (r.stdout.splitlines() for r in ran)
    assert message_batch[0].startswith("msgbatch_") and message_batch[0].endswith("in_progress")
    assert message_batch[1] == "ended 2 succeeded"
    assert {line.split(" -> ")[0] for line in message_batch[2:4]} == {"capital", "colour"}
    assert message_batch[4] == "True"
    assert openai_batch == ["completed message assistant"]


CHECKS: dict[str, Callable[[list[Ran], Path], None]] = {
    "getting-started.md": _getting_started,
    "guides/openai-python.md": _python,
    "guides/openai-node.md": _node,
    "guides/curl.md": _curl,
    "guides/cli.md": _cli,
    "guides/webhooks.md": _webhooks,
    "guides/scheduling.md": _scheduling,
    "guides/online.md": _online,
    "guides/anthropic.md": _anthropic,
}


def _free_port_pair() -> int:
    """A free port whose next one is free too: `serve --online` gives each worker one."""
    while True:
        port = free_port()
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


@dataclass
class DocsServer:
    served: Served
    online_port: int


@pytest.fixture(scope="module")
def server(models_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DocsServer]:
    """One `overnight serve`, started as the pages' not-run blocks start theirs."""
    online = _free_port_pair()
    with serving(
        tmp_path_factory.mktemp("docs"),
        models_data_dir,
        "--online",
        "--online-port",
        str(online),
        # Eager engines with 512 MiB of KV cache each (SmolLM2's 8,192-token context fits
        # once, whatever the dtype): two compiling beside the other test files' engines ran a
        # 24 GB machine out of memory, and with 1 GiB each the suite peaked at 20.7 GB of it.
        # (vLLM arguments `serve` passes on to its workers.)
        "--enforce-eager",
        "--kv-cache-memory-bytes",
        "512M",
        OVERNIGHT_WEBHOOK_ALLOW_PRIVATE="1",
    ) as served:
        yield DocsServer(served, online)


@pytest.mark.engine
@pytest.mark.parametrize("page", example_pages())
def test_the_examples_run_as_written(page: str, server: DocsServer) -> None:
    if page == "guides/openai-node.md" and (why := _npm_reachable()):
        pytest.skip(why)
    served = server.served
    ports = {
        DOCUMENTED_PORT: f"127.0.0.1:{served.port}",
        DOCUMENTED_ONLINE_PORT: f"127.0.0.1:{server.online_port}",
    }
    ran = [run(b, served.workdir, served.env, ports) for b in blocks(page) if not b.skip_reason]
    check = CHECKS.get(page)
    if check is None:
        assert ran == [], f"{page} has examples that run but nothing checks what they did"
        return
    check([r for r in ran if r.block.kind != "javascript"], served.workdir)


# -- The README's quick start, run as written against the same `overnight serve` --

README = REPO / "README.md"


def quickstart_blocks() -> list[tuple[str, str]]:
    text = README.read_text()
    section = text[text.index("## Quick start") :]
    section = section[: section.index("\n## ", 1)]
    return re.findall(r"^```(bash|python)\n(.*?)^```", section, re.S | re.M)


def test_banner_shows_the_way_in(server: DocsServer) -> None:
    served = server.served
    text = served.log.read_text()
    assert f"API        {served.url}/v1" in text
    assert f"Dashboard  {served.url}/dashboard" in text
    assert f'client = OpenAI(base_url="{served.url}/v1", api_key="anything")' in text
    assert (served.workdir / "data" / "overnight.db").exists()  # the embedded default


def test_quickstart_blocks_run_as_written(server: DocsServer) -> None:
    served = server.served
    workdir = checkout_beside(served.workdir, "readme")
    blocks = quickstart_blocks()
    assert [kind for kind, _ in blocks].count("python") >= 1
    assert sum("curl" in code for kind, code in blocks if kind == "bash") >= 1
    # One GiB of KV cache for run-batch's engine (vLLM's variable counts whole GiB): beside
    # serve's and the other test files' engines its default two ran a 24 GB machine out of
    # memory.
    env = {**served.env, "VLLM_CPU_KVCACHE_SPACE": "1"}
    ports = {DOCUMENTED_PORT: f"127.0.0.1:{served.port}"}
    outputs = []
    for kind, code in blocks:
        ran = run(Block("README.md", kind, code, None), workdir, env, ports)
        outputs.append((kind, code, ran.stdout))

    sdk = next(out for kind, _c, out in outputs if kind == "python")
    assert "completed" in sdk
    _all_ok(sdk, QUICK)
    _all_ok(next(out for kind, code, out in outputs if "curl" in code), QUICK)
    _all_ok((workdir / "requests.output.jsonl").read_text(), QUICK)
    embeddings = [orjson.loads(x) for x in (workdir / "embeddings.jsonl").read_bytes().splitlines()]
    assert sorted(e["custom_id"] for e in embeddings) == ["e1", "e2"]
    assert len(embeddings[0]["response"]["body"]["data"][0]["embedding"]) == 384
    _all_ok((workdir / "results.jsonl").read_text(), QUICK)


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


def _described(pids: list[int]) -> list[str]:
    described = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            described.append(f"{pid} {process.name()}: {' '.join(process.cmdline())[:200]}")
        except psutil.Error:
            described.append(f"{pid} (gone)")
    return described


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


def test_each_engine_computes_on_cores_of_its_own(server: DocsServer) -> None:
    """The idle embedding engine takes no cycles from the chat engine's cores (issue 16)."""
    served = server.served
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one core: there is nothing to share out")
    workers = served.live_workers()
    chat = _pinned_cores(int(str(workers["SmolLM2-135M-Instruct"]["pid"])))
    embedding = _pinned_cores(int(str(workers["all-MiniLM-L6-v2"]["pid"])))
    assert chat and embedding, (chat, embedding)
    assert not chat & embedding, (chat, embedding)
    assert max(os.sched_getaffinity(0)) in embedding


# The bundled SmolLM2's KV cache per token, in values: K and V, 30 layers, 3 KV heads of 64.
SMOLLM2_KV_VALUES_PER_TOKEN = 2 * 30 * 3 * 64
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def test_serve_gives_its_workers_the_engine_arguments(server: DocsServer) -> None:
    """`serve --enforce-eager --kv-cache-memory-bytes 512M` reaches every worker's engine; the
    worker's dashboard page shows what it runs with."""
    served = server.served
    effective = {}
    for model, worker in served.live_workers().items():
        page = httpx.get(f"{served.url}/dashboard/api/workers/{worker['id']}", timeout=30)
        effective[model] = {pair["key"]: pair["value"] for pair in page.json()["effective"]}
        assert effective[model]["enforce_eager"] == "true", (model, effective[model])
    chat = effective["SmolLM2-135M-Instruct"]
    per_token = SMOLLM2_KV_VALUES_PER_TOKEN * DTYPE_BYTES[chat["dtype"]]
    tokens = int(chat["kv_cache_tokens"])
    # 512 MiB, whole blocks of it: not the 2 GiB the worker reserves when no size is given
    # (whose VLLM_CPU_KVCACHE_SPACE vLLM would let override the flag).
    assert tokens * per_token <= 2**29 < (tokens + 1024) * per_token, chat


def test_a_killed_worker_is_replaced_then_ctrl_c_stops_all(server: DocsServer) -> None:
    """Last: it ends the module's `overnight serve`."""
    served = server.served
    chat = served.live_workers()["SmolLM2-135M-Instruct"]
    old_pid = int(str(chat["pid"]))
    engine = _descendants(old_pid)
    assert engine, "the worker runs vLLM's engine core in child processes"
    # vLLM's CPU layout: the engine core runs the model in a process of its own, a grandchild
    # of the worker; it must die with the worker too (the engine tests run it in the core's).
    assert any(p.ppid() != old_pid for p in engine), _described([p.pid for p in engine])
    os.kill(old_pid, signal.SIGKILL)
    assert _outliving(engine, 60) == [], "the dead worker's engine processes survived"
    # Registered while its engine starts: Ctrl-C then stops a starting engine too.
    wait_until(
        "a new chat worker",
        served,
        lambda: any(
            w["model"] == "SmolLM2-135M-Instruct" and w["pid"] != old_pid
            for w in served.workers()
            if w["state"] in ("loading", "idle", "running")
        ),
    )
    everything = _descendants(served.process.pid)
    served.process.send_signal(signal.SIGINT)
    assert served.process.wait(90) == 0
    # An orphan never ends; a child that was starting when its parent went (a new worker's
    # engine, before it armed its parent-death signal) ends itself at its parent check.
    survivors = _outliving(everything, 10)
    assert survivors == [], f"processes outlived `overnight serve`: {_described(survivors)}"


def checkout_beside(workdir: Path, name: str) -> Path:
    """A second scratch checkout beside `serve`'s, on its data: the README's blocks write files
    of the same names as the pages' blocks (and `run-batch` would resume the pages' run)."""
    checkout = workdir / name
    checkout.mkdir()
    (checkout / ".venv").symlink_to(workdir / ".venv")
    (checkout / "data").symlink_to(workdir / "data")
    return checkout
