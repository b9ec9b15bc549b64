"""Shared fixtures: every database test runs on SQLite and on PostgreSQL."""

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.config import Settings
from tests.harness import RunningServer, fresh_database, running_server

BACKENDS = ["sqlite", "postgresql"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--backend", choices=[*BACKENDS, "all"], default="all", help="database backends to test"
    )


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "backend" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("--backend")
        metafunc.parametrize("backend", BACKENDS if chosen == "all" else [chosen], scope="function")


@pytest.fixture
def settings(backend: str, tmp_path: Path) -> Iterator[Settings]:
    """Settings of an isolated deployment: its own data dir and its own empty database."""
    with fresh_database(backend, tmp_path) as url:
        yield Settings(data_dir=tmp_path, database_url=url, _env_file=None)  # type: ignore[call-arg]


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


def pytest_configure(config: pytest.Config) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
