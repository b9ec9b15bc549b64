"""Riding out a database outage: capped exponential backoff, the state told once per change.

A worker never exits because the database is away: it waits with the engine loaded, and
its health says `waiting_for_database` until the database answers again.
"""

import asyncio
import contextlib
from collections.abc import Callable, Iterator

from sqlalchemy.exc import InterfaceError, OperationalError

from worker.health import Health, WorkerState

FIRST_DELAY_SECONDS = 0.5
MAX_DELAY_SECONDS = 5.0

# What an unreachable, restarting or stopped database raises (connection refused or reset).
DATABASE_DOWN = (OperationalError, InterfaceError)


def backoff(cap: float = MAX_DELAY_SECONDS) -> Iterator[float]:
    """0.5, 1, 2, 4 … seconds, never more than `cap`."""
    delay = FIRST_DELAY_SECONDS
    while True:
        yield min(delay, cap)
        delay *= 2


def first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


async def until_database(
    health: Health, stop: asyncio.Event, action: Callable[..., object], *args: object
) -> bool:
    """Run `action(*args)` in a thread until the database answers; False if stopped first."""
    delays = backoff()
    while not stop.is_set():
        try:
            await asyncio.to_thread(action, *args)
            return True
        except DATABASE_DOWN as exc:
            health.set(WorkerState.WAITING_FOR_DATABASE, first_line(exc))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), next(delays))
    return False
