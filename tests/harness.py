"""Real parts for tests: a fresh database (SQLite file or PostgreSQL) and the app under uvicorn."""

import fcntl
import functools
import hashlib
import os
import secrets
import select
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import uvicorn
from moto.server import ThreadedMotoServer

from app.config import Settings
from app.db.session import engine_for, upgrade
from app.http_server import server_options
from app.main import create_app

REPO = Path(__file__).resolve().parent.parent
POSTGRES_ADMIN_URL = os.environ.get(
    "OVERNIGHT_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/test"
)
BACKENDS = ["sqlite", "postgresql"]
# The product's default lease. Tests whose assertions a lapse they did not cause would change
# (who holds a shard, what ran and how often) use it in place of their short test leases: a
# test process can stall for seconds on a loaded machine, and a 3 s or 6 s lease lapsed then.
PRODUCT_LEASE_SECONDS: float = Settings.model_fields["lease_seconds"].default


def chosen_backends(config: pytest.Config) -> list[str]:
    """The databases this run tests on: `--backend`, both by default."""
    chosen = config.getoption("--backend")
    return BACKENDS if chosen == "all" else [chosen]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def readable(sock: socket.socket, seconds: float) -> bool:
    """Whether `sock` has something to read within `seconds`. poll(2), not select(2): a test
    process that has opened many files holds descriptors (1,024 and up) select cannot take."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(seconds * 1000))


def read_http_message(sock: socket.socket) -> bytes:
    """An HTTP request or response from `sock`: its head, then `content-length` bytes of body
    (a server may write the two apart, and they can arrive apart). ConnectionError if the peer
    hangs up before the message is whole."""
    data = b""
    while not _whole(data):
        more = sock.recv(65536)
        if not more:
            raise ConnectionError(f"the peer hung up before its message was whole: {data[:300]!r}")
        data += more
    return data


def _whole(data: bytes) -> bool:
    head, separator, body = data.partition(b"\r\n\r\n")
    lengths = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
    length = int(lengths[0].split(b":", 1)[1]) if lengths else 0
    return bool(separator) and len(body) >= length


def pauses(longest: float = 0.25) -> Iterator[float]:
    """Waits between polls of the API: 20 ms at first, half as long again each time, up to
    `longest`. A poll costs the test process and its server about 5 ms of CPU: at 50 a second
    a test took a quarter of a core from the engines it was waiting on."""
    pause = 0.02
    while True:
        yield pause
        pause = min(pause * 1.5, longest)


@contextmanager
def fresh_database(backend: str, data_dir: Path, migrated: bool = False) -> Iterator[str]:
    """Yields a SQLAlchemy URL of a database of its own, dropped afterwards: empty, or with
    `migrated` a copy of one that the migrations built once for the whole test run."""
    if backend == "sqlite":
        path = data_dir / "overnight.db"
        if migrated:
            shutil.copyfile(_sqlite_template(), path)
        yield f"sqlite:///{path}"
        return
    name = "overnight_test_" + secrets.token_hex(6)
    template = f' TEMPLATE "{_postgres_template()}"' if migrated else ""
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"{template}')
    url = _postgres_url(name)
    try:
        yield url
    finally:
        engine_for(url).dispose()
        with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextmanager
def isolated_settings(backend: str, data_dir: Path) -> Iterator[Settings]:
    """Settings of an isolated deployment: its own data dir and its own migrated database."""
    data_dir.mkdir(parents=True, exist_ok=True)
    with fresh_database(backend, data_dir, migrated=True) as url:
        yield Settings(data_dir=data_dir, database_url=url, _env_file=None)  # type: ignore[call-arg]


def _postgres_url(name: str) -> str:
    base = POSTGRES_ADMIN_URL.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    return f"{base}/{name}"


def _migrations_digest() -> str:
    """Names a template after the migrations that built it: a changed one builds a new one."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "migrations" / "versions").glob("*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:12]


@functools.cache
def _sqlite_template() -> Path:
    folder = Path(tempfile.gettempdir()) / "overnight-test-templates"
    folder.mkdir(exist_ok=True)
    template = folder / f"sqlite-{_migrations_digest()}.db"
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the test processes build it once between them
        if not template.exists():
            building = folder / f"building-{os.getpid()}.db"
            url = f"sqlite:///{building}"
            upgrade(url)
            engine_for(url).dispose()  # its last connection checkpoints the WAL into the file
            os.replace(building, template)
    return template


@functools.cache
def _postgres_template() -> str:
    name = f"overnight_template_{_migrations_digest()}"
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('overnight-test-template'))")
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            building = f"{name}_building"
            conn.execute(f'DROP DATABASE IF EXISTS "{building}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{building}"')
            url = _postgres_url(building)
            upgrade(url)
            engine_for(url).dispose()  # a template is copied only while no one is connected
            conn.execute(f'ALTER DATABASE "{building}" RENAME TO "{name}"')
        conn.execute("SELECT pg_advisory_unlock(hashtext('overnight-test-template'))")
    return name


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
