"""The database's clock: the one every lease, lapse and expiry is judged by.

Hosts may disagree by minutes (a drifting clock, an NTP step); the database is the one party
every process talks to, so "now" is read there, as Unix seconds, in the statement that
decides. `db_now()` is that time as a SQL expression:

- PostgreSQL: `statement_timestamp()`, the start of the current statement. Unlike `now()` it
  moves within a transaction, and unlike `clock_timestamp()` it is stable within a statement,
  so a comparison with it can use an index and every row of a statement sees one time.
- SQLite: `julianday('now')`, which SQLite keeps the same for a whole statement
  (`unixepoch('subsec')` needs SQLite 3.42; Python's bundled SQLite may be older).
"""

from typing import Any

from sqlalchemy import Float, select
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

# Julian day of 1970-01-01T00:00Z, and seconds in a day.
_UNIX_EPOCH_JULIAN_DAY = 2440587.5
_DAY_SECONDS = 86400.0


class db_now(FunctionElement[float]):
    """The database's time now, in Unix seconds (a float)."""

    type = Float()
    name = "db_now"
    inherit_cache = True


@compiles(db_now, "postgresql")
def _postgresql_now(_element: db_now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return "CAST(EXTRACT(EPOCH FROM statement_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _sqlite_now(_element: db_now, _compiler: SQLCompiler, **_kw: Any) -> str:
    return f"((julianday('now') - {_UNIX_EPOCH_JULIAN_DAY}) * {_DAY_SECONDS})"


def read_db_now(session: Session) -> float:
    """The database's time now, for a value a process must hold in Python (a signature's
    timestamp, a backoff's start); decisions compare with `db_now()` in SQL instead."""
    now = session.scalar(select(db_now()))
    assert now is not None
    return float(now)
