"""Shared fixtures: every database test runs on SQLite and on PostgreSQL."""

import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

import boto3
import httpx
import openai
import pytest

from app.config import Settings
from tests.file_server import serving_files
from tests.harness import (
    BACKENDS,
    RunningServer,
    chosen_backends,
    isolated_settings,
    running_server,
    s3_server,
)
from tests.reference_llm import answers_in_background


def _spread_engines_over_cores() -> None:
    """Each pytest-xdist worker's engines compute on a core of their own.

    vLLM's `auto` binds every CPU engine's compute threads to the same core, keeping the last
    one for schedulers and front ends: with three test processes starting engines at once,
    one core did all their compute while the other was a third idle. An explicit binding per
    test process spreads them. Tests of `overnight serve` start it in a user's environment
    (no `VLLM_*`), so its own binding is what they see.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    cores = sorted(os.sched_getaffinity(0))
    if not worker.startswith("gw") or len(cores) < 2 or "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = str(cores[int(worker[2:]) % len(cores)])


_spread_engines_over_cores()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend", choices=[*BACKENDS, "all"], default="all", help="database backends to test"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        backends = chosen_backends(metafunc.config)
        # `@pytest.mark.backends("sqlite")`: a test whose database part is covered elsewhere.
        if only := metafunc.definition.get_closest_marker("backends"):
            backends = [b for b in backends if b in only.args]
        metafunc.parametrize("backend", backends, scope="function")
    if "databases" in metafunc.fixturenames:
        # A test that sends each of its cases to a server on every database (one id for all).
        backends = chosen_backends(metafunc.config)
        metafunc.parametrize("databases", [backends], ids=["+".join(backends)])


@pytest.fixture
def settings(backend: str, tmp_path: Path) -> Iterator[Settings]:
    """Settings of an isolated deployment: its own data dir and its own migrated database."""
    with isolated_settings(backend, tmp_path) as settings:
        yield settings


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    with running_server(settings) as running:
        yield running


@pytest.fixture
def client(server: RunningServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=server.base_url,
        api_key="sk-test",
        max_retries=0,
        _strict_response_validation=True,
    ) as c:
        yield c


@pytest.fixture
def async_client(server: RunningServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=server.base_url,
        api_key="sk-test",
        max_retries=0,
        _strict_response_validation=True,
    )


@pytest.fixture
def http(server: RunningServer) -> Iterator[httpx.Client]:
    """Plain HTTP, as curl would call the API."""
    with httpx.Client(base_url=server.url, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """The URL of an S3 server (moto) for the session; boto3 finds test credentials in env."""
    with pytest.MonkeyPatch.context() as env, s3_server() as url:
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            env.delenv(name, raising=False)
        env.setenv("AWS_ACCESS_KEY_ID", "testing")
        env.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        env.setenv("AWS_DEFAULT_REGION", "us-east-1")
        yield url


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new empty bucket on the session's S3 server."""
    name = "overnight-test-" + secrets.token_hex(6)
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="session")
def models_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose `models/` holds the bundled SmolLM2, converted once for the whole run:
    the test processes share it (the first converts, the others wait on its lock)."""
    from worker.models import ensure_converted

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's own folder, above each test process's
    ensure_converted(root / "shared-data")
    return root / "shared-data"


@pytest.fixture(scope="session")
def smollm2(models_data_dir: Path) -> Path:
    """The bundled SmolLM2's converted folder, for every real-engine test of the run."""
    from worker.models import ensure_converted

    return ensure_converted(models_data_dir)


@pytest.fixture(scope="session")
def reference(smollm2: Path, models_data_dir: Path) -> Iterator[Callable[[], list[str]]]:
    """vLLM's own `LLM.chat` answers to REFERENCE_CHATS (tests/reference_llm.py), greedy,
    computed once for the run in the background; calling waits for them."""
    from tests.engine_fixtures import ENGINE_ENV

    env = {**os.environ, **ENGINE_ENV}
    with answers_in_background(smollm2, models_data_dir / "reference", env) as answers:
        yield answers


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture
def keys(settings: Settings) -> dict[str, str]:
    """A member key each for two projects, `alpha` and `beta`."""
    from app.db.session import session_scope
    from app.services.auth import create_key

    with session_scope(settings) as session:
        return {project: create_key(session, project)[1] for project in ("alpha", "beta")}


@pytest.fixture
def file_server() -> Iterator[str]:
    with serving_files() as url:
        yield url
