"""`overnight --version` and every `--help` answer at once: the real guard is what they import
(no vLLM, torch, SDK or database layer), the wall time a check that it shows."""

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.cli import build_parser
from app.client.arguments import Deferred
from tests.engine_fixtures import REPO
from tests.harness import RunningServer

OVERNIGHT = Path(sys.executable).with_name("overnight")
FAST_ENOUGH_SECONDS = 0.5
# What made `--help` take seconds before; none of it is needed to print a usage.
HEAVY = {
    "vllm",
    "torch",
    "transformers",
    "sqlalchemy",
    "alembic",
    "openai",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "boto3",
    "botocore",
    "httpx",
    "rich",
}
# The interpreter's start-up hooks of this venv (an editable install, setuptools' shim), and
# Jython's `org.python.core`, which the standard library's `copy` tries first.
SITE_HOOKS = ("__editable__", "_distutils_hack", "sitecustomize", "_virtualenv", "org")


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[argparse._SubParsersAction]:  # type: ignore[type-arg]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield action


def _leaves(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    found = False
    for action in _subparsers(parser):
        for name, child in action.choices.items():
            found = True
            yield from _leaves(child, (*path, name))
    if not found:
        yield path, parser


COMMANDS = sorted(path for path, _parser in _leaves(build_parser()))
INVOCATIONS = [("--version",), ("--help",), *((*path, "--help") for path in COMMANDS)]


def _ids(invocation: tuple[str, ...]) -> str:
    return " ".join(invocation)


def test_every_command_is_covered() -> None:
    commands = {" ".join(path) for path in COMMANDS}
    assert {"serve", "worker", "run-batch", "batches submit", "keys create"} <= commands
    assert len(commands) > 20


def _imported(importtime: str) -> set[str]:
    """The top-level packages `-X importtime` reports."""
    imported = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in importtime.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    imported.discard("imported package")  # the header line
    return imported


def _run_importing(
    command: tuple[str, ...], env: dict[str, str] | None = None
) -> tuple[str, set[str]]:
    """Runs `overnight COMMAND` under `-X importtime`: what it printed, and what it imported."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app.cli", *command],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout, _imported(result.stderr)


@pytest.mark.parametrize("invocation", INVOCATIONS, ids=_ids)
def test_answers_without_importing_the_service(invocation: tuple[str, ...]) -> None:
    printed, imported = _run_importing(invocation)
    assert printed.strip(), "nothing printed"
    assert not imported & HEAVY
    foreign = {
        name
        for name in imported - set(sys.stdlib_module_names) - {"app", "worker"}
        if not name.startswith(SITE_HOOKS)
    }
    assert not foreign, f"third-party imports for {_ids(invocation)}: {sorted(foreign)}"


# What a command over HTTP has no use for: the server's stack, the database layer, S3, vLLM.
SERVER_SIDE = HEAVY - {"openai", "httpx", "pydantic", "rich"}
OVER_HTTP = [("batches", "list"), ("files", "list"), ("projects", "list"), ("webhooks", "list")]


@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("command", [*OVER_HTTP, ("status",)], ids=" ".join)
def test_commands_over_http_load_none_of_the_server(
    server: RunningServer, command: tuple[str, ...]
) -> None:
    """The people's commands talk to the API: the settings they read (for a base URL) must not
    pull in the web framework, SQLAlchemy or boto3 (they did, a third of each command's start)."""
    _, imported = _run_importing(
        command, {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "k"}
    )
    assert sorted(imported & SERVER_SIDE) == []


@pytest.mark.parametrize("invocation", INVOCATIONS, ids=_ids)
def test_answers_under_half_a_second(invocation: tuple[str, ...]) -> None:
    """The fastest of up to three runs of the installed command: one busy moment is not the
    CLI (a run within the bound ends the tries)."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        result = subprocess.run(
            [str(OVERNIGHT), *invocation], capture_output=True, text=True, timeout=120
        )
        times.append(time.perf_counter() - started)
        assert result.returncode == 0, result.stderr
        if times[-1] < FAST_ENOUGH_SECONDS:
            break
    assert min(times) < FAST_ENOUGH_SECONDS, f"{_ids(invocation)}: {times}"


def test_every_client_command_resolves() -> None:
    """A command's module is named, not imported, to build the parser: each name must exist."""
    deferred = [p.get_default("func") for _path, p in _leaves(build_parser())]
    people = [d for d in deferred if isinstance(d, Deferred)]
    assert len(people) > 20
    for command in people:
        assert callable(command.resolve()), f"{command.module}.{command.function}"


@pytest.mark.parametrize("command", ["worker", "run-batch"])
def test_plain_help_is_overnights_and_says_how_to_see_vllms(command: str) -> None:
    result = subprocess.run(
        [str(OVERNIGHT), command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert f"overnight {command} --help=all" in " ".join(result.stdout.split())
    assert "--kv-cache-dtype" not in result.stdout  # vLLM's, behind --help=all


def test_run_batch_help_all_lists_vllms_engine_arguments() -> None:
    result = subprocess.run(
        [str(OVERNIGHT), "run-batch", "--help=max-model-len"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "--max-model-len" in result.stdout
    assert "overnight run-batch" in result.stdout or "Arguments matching" in result.stdout


@pytest.mark.parametrize(
    ("invocation", "code", "said"),
    [
        (("keys", "list", "--json"), 0, "[]"),
        (("keys", "revoke", "key_nope"), 1, "overnight: error: No such API key object: key_nope"),
    ],
)
def test_commands_on_this_machine_leave_the_sdk_alone(
    tmp_path: Path, invocation: tuple[str, ...], code: int, said: str
) -> None:
    """Without a base URL, `keys` works on this machine's database: the SDK (a second of
    imports) is for commands that call an API."""
    env = {
        **os.environ,
        "OVERNIGHT_DATA_DIR": str(tmp_path),
        "OVERNIGHT_DATABASE_URL": f"sqlite:///{tmp_path}/overnight.db",
        "OPENAI_BASE_URL": "",
    }
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "app.cli", *invocation],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert result.returncode == code, result.stderr
    reported = result.stdout if code == 0 else result.stderr
    assert said in reported.splitlines()
    assert "openai" not in _imported(result.stderr)
