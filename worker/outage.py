"""Riding out a database outage: capped exponential backoff, the state told once per change.

A worker never exits because the database is away: it waits with the engine loaded, and
its health says `waiting_for_database` until the database answers again. An error that is
not an outage (a statement the database refuses) is a bug: waiting would never end it.
"""

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from worker.health import Health, HealthState

FIRST_DELAY_SECONDS = 0.5
MAX_DELAY_SECONDS = 5.0

# What an unreachable, restarting or stopped database raises (connection refused or reset),
# or one that does not answer in time (no pooled connection comes back).
DATABASE_DOWN = (OperationalError, InterfaceError, PoolTimeout)


def backoff(cap: float = MAX_DELAY_SECONDS) -> Iterator[float]:
    """0.5, 1, 2, 4 … seconds, never more than `cap`."""
    delay = FIRST_DELAY_SECONDS
    while True:
        yield min(delay, cap)
        delay *= 2


def database_down(error: BaseException) -> bool:
    """Whether `error` says the database is away or busy, which waiting cures.

    SQLite reports a statement it cannot run (no such table or column, a syntax error) as an
    OperationalError too, with the generic SQLITE_ERROR code; its outages (busy, locked, I/O,
    cannot open) have codes of their own.
    """
    if isinstance(error, DBAPIError) and error.connection_invalidated:
        return True
    if not isinstance(error, DATABASE_DOWN):
        return False
    driver_error = getattr(error, "orig", None)
    return getattr(driver_error, "sqlite_errorname", None) != "SQLITE_ERROR"


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


async def until_database(
    health: Health, stop: asyncio.Event, action: Callable[..., object], *args: object
) -> bool:
    """Run `action(*args)` in a thread until the database answers; False if stopped first.
    Raises what is not an outage."""
    delays = backoff()
    while not stop.is_set():
        try:
            await asyncio.to_thread(action, *args)
            return True
        except Exception as exc:
            if not database_down(exc):
                raise
            health.set(HealthState.WAITING_FOR_DATABASE, first_line(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), next(delays))
    return False
