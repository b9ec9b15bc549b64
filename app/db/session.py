"""Database engine and sessions: SQLite (WAL, immediate transactions) or PostgreSQL."""

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import migrations
from app.config import Settings
from app.db.migration_lock import migration_lock

READ_ONLY = "overnight_read_only"
# Threads the API's request transactions run on (app/api/unit_of_work.py), and the
# connections each engine keeps: those, plus some for the background loops. An engine closes
# a connection returned beyond its pool's size, and a reconnect costs what dozens of reads do.
TRANSACTION_THREADS = 12
POOL_SIZE = TRANSACTION_THREADS + 4


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control from pysqlite so that we can BEGIN IMMEDIATE:
        # every transaction holds the write lock from its start, so a read-then-write
        # never fails with SQLITE_BUSY halfway, and busy_timeout makes others wait.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Readers need no lock in WAL mode: a read-only session begins deferred.
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        # On the driver's connection: through SQLAlchemy's execution, a BEGIN costs as
        # much as a request's query.
        conn.connection.driver_connection.execute("BEGIN" if read_only else "BEGIN IMMEDIATE")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        in_memory = path in ("", ":memory:")  # SQLAlchemy keeps its own pool for these
        if not in_memory:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        pool: dict[str, Any] = (
            {} if in_memory else {"pool_size": POOL_SIZE, "max_overflow": POOL_SIZE}
        )
        engine = create_engine(
            url, connect_args={"check_same_thread": False, "timeout": 30}, **pool
        )
        _configure_sqlite(engine)
        return engine
    return create_engine(url, pool_size=POOL_SIZE, max_overflow=24, pool_pre_ping=True)


@lru_cache
def engine_for(url: str) -> Engine:
    return make_engine(url)


@lru_cache
def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(engine_for(url), expire_on_commit=False)


@lru_cache
def read_session_factory(url: str) -> sessionmaker[Session]:
    """Sessions for requests that only read: on SQLite they never wait for the write lock."""
    read_only = engine_for(url).execution_options(**{READ_ONLY: True})
    return sessionmaker(read_only, expire_on_commit=False)


@contextmanager
def session_scope(settings: Settings) -> Iterator[Session]:
    """One unit of work outside a request: commits on success, rolls back on error."""
    with session_factory(settings.sqlalchemy_url)() as session, session.begin():
        yield session


@contextmanager
def read_scope(settings: Settings) -> Iterator[Session]:
    """A unit of work that only reads (on SQLite it takes no write lock)."""
    with read_session_factory(settings.sqlalchemy_url)() as session, session.begin():
        yield session


@contextmanager
def one_statement_scope(settings: Settings) -> Iterator[Session]:
    """A session for one statement that is a whole transaction by itself (a claim).

    On PostgreSQL it runs in autocommit: the statement is atomic on its own, and a busy
    machine makes every round trip wait for a core, BEGIN and COMMIT included. SQLite keeps
    its immediate transaction (no round trips there).
    """
    with session_factory(settings.sqlalchemy_url)() as session, session.begin():
        if session.get_bind().dialect.name == "postgresql":
            session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
        yield session


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(url: str) -> None:
    """Bring the database schema to the newest migration, one process at a time: those that
    wait find it at head (`migration_lock`)."""
    engine = engine_for(url)  # creates the SQLite folder
    config = alembic_config(url)
    with migration_lock(engine) as connection:
        config.attributes["connection"] = connection  # PostgreSQL's: it holds the lock
        command.upgrade(config, "head")
