"""One process migrates at a time: API replicas and workers starting together take turns.

Each of them runs the migrations at start-up. Without a lock they would all create the same
tables at once, and all but one would crash; with it, the first migrates and the others,
once it is done, find the schema at head and carry on.
"""

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, func, select

# pg_advisory_xact_lock's key: any fixed number, the same in every process ("overnigh").
ADVISORY_LOCK_KEY = 0x6F7665726E696768


@contextmanager
def migration_lock(engine: Engine) -> Iterator[Connection | None]:
    """Held while migrating `engine`'s database.

    On PostgreSQL it yields the connection to migrate on: its transaction holds an advisory
    lock, released when the migrations commit (or roll back). On SQLite, whose migrations
    run on their own connection, it holds a file lock beside the database file.
    """
    if engine.dialect.name == "postgresql":
        with engine.begin() as connection:
            connection.execute(select(func.pg_advisory_xact_lock(ADVISORY_LOCK_KEY)))
            yield connection
        return
    database = engine.url.database
    if not database or database == ":memory:":  # only this process sees it
        yield None
        return
    with _file_lock(Path(f"{database}-migrations.lock")):
        yield None


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # released when the file is closed
        yield
