"""Real parts for tests: a fresh database (SQLite file or PostgreSQL) and the app under uvicorn."""

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import uvicorn
from moto.server import ThreadedMotoServer

from app.config import Settings
from app.db.session import engine_for
from app.http_server import server_options
from app.main import create_app

POSTGRES_ADMIN_URL = os.environ.get(
    "OVERNIGHT_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def fresh_database(backend: str, data_dir: Path) -> Iterator[str]:
    """Yields a SQLAlchemy URL of an empty database, dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{data_dir / 'overnight.db'}"
        return
    name = "overnight_test_" + secrets.token_hex(6)
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    url = f"{base}/{name}"
    try:
        yield url
    finally:
        engine_for(url).dispose()
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class RunningServer:
    url: str
    settings: Settings

    @property
    def base_url(self) -> str:
        return self.url + "/v1"


@contextmanager
def running_server(settings: Settings) -> Iterator[RunningServer]:
    """The real app served by uvicorn on a free loopback port, in a thread."""
    port = free_port()
    settings = settings.model_copy(update={"host": "127.0.0.1", "port": port})
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        **server_options(settings),
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield RunningServer(f"http://127.0.0.1:{port}", settings)
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def s3_server() -> Iterator[str]:
    """A real S3 protocol endpoint (moto) on a free loopback port; yields its URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()
