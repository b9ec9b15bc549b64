"""A claim that fails for a bug stops the worker with its traceback; an outage is waited out.

Only an unreachable or busy database means `waiting_for_database`: a statement the
database refuses never succeeds by waiting, so the worker process exits 1 (its supervisor
restarts it) and logs why, instead of showing `waiting_for_database` for ever.
"""

import socket
import sqlite3
import subprocess
from pathlib import Path

import orjson
from sqlalchemy import create_engine, make_url, text
from sqlalchemy.exc import DBAPIError

from app.config import Settings
from app.db.session import engine_for, upgrade
from tests.engine_fixtures import FakeWorkerProcess
from worker.outage import database_down


def _break_the_claim(settings: Settings) -> None:
    """A schema the claim's statement does not match: the database refuses it each time."""
    with engine_for(settings.sqlalchemy_url).begin() as conn:
        conn.execute(text("ALTER TABLE shards RENAME COLUMN lease_epoch TO lease_epoch_gone"))


def test_a_claim_that_fails_for_a_bug_stops_the_worker_with_its_traceback(
    settings: Settings,
) -> None:
    fast = settings.model_copy(update={"worker_poll_seconds": 0.1, "lease_seconds": 3.0})
    upgrade(fast.sqlalchemy_url)
    _break_the_claim(fast)
    worker = FakeWorkerProcess(fast, "w-bug", [])
    try:
        code = worker.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        worker.stop()
    log = worker.tail(20_000)
    assert code == 1, f"the worker did not stop: {log[-3000:]}"
    assert "claiming a shard failed: stopping the worker" in log
    assert "Traceback" in log and "lease_epoch" in log
    assert "waiting_for_database" not in log
    health = orjson.loads(Path(worker.health_path).read_bytes())
    assert health["state"] == "stopped" and "lease_epoch" in health["detail"]


def _error(engine_url: str, statement: str) -> DBAPIError:
    engine = create_engine(
        engine_url, connect_args={"timeout": 0} if "sqlite" in engine_url else {}
    )
    try:
        with engine.connect() as conn:
            conn.execute(text(statement))
    except DBAPIError as error:
        return error
    finally:
        engine.dispose()
    raise AssertionError(f"{statement} did not fail")


def test_only_outages_count_as_the_database_being_down(settings: Settings) -> None:
    url = settings.sqlalchemy_url
    upgrade(url)
    assert not database_down(_error(url, "SELECT nothing FROM no_such_table"))
    if url.startswith("sqlite"):
        path = url.removeprefix("sqlite:///")
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # another process writing
        try:
            assert database_down(_error(url, "BEGIN IMMEDIATE"))
        finally:
            holder.close()
    else:
        with socket.socket() as closed:  # a port nothing listens on: the server is away
            closed.bind(("127.0.0.1", 0))
            port = closed.getsockname()[1]
        away = make_url(url).set(host="127.0.0.1", port=port)
        assert database_down(_error(away.render_as_string(hide_password=False), "SELECT 1"))
