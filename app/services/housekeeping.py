"""The API process's background work: validate new batches, finalize ready ones, expire files,
deliver webhooks, plan the schedule, prune what is past retention (`app.services.retention`).

Five loops run side by side so that a long finalization never delays the
validation of a newly created batch. Validation, finalization, the planner and retention step on the
default executor; the deliverer's pass only claims webhook deliveries and starts their
attempts, which run on the senders' own slots and threads (`webhook_senders`), so no
receiver, however slow, holds up the other loops or the next pass. Each wakes every
`housekeeping_interval_seconds`, or at once when `wake()` is called (the create
route wakes validation, the cancel route finalization). Every step is a
lease-guarded, restartable unit, so any number of API replicas may run these
loops against one database.
"""

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import threading
from collections.abc import Awaitable, Callable

from app.config import Settings
from app.db.clock import read_db_now
from app.db.session import session_scope
from app.services import singleton_lease
from app.services.file_expiry import expire_files
from app.services.retention import retain
from app.services.schedule import replan
from app.services.steps.chunk_cleanup import delete_leftover_chunks
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.services.uploads import expire_uploads
from app.services.webhook_delivery import deliver_due
from app.services.webhook_senders import senders
from app.storage import storage_of

log = logging.getLogger("overnight.housekeeping")

# Storage temp files (or open multipart uploads) older than this belong to a writer that died.
STALE_TEMP_SECONDS = 24 * 3600

VALIDATION, FINALIZATION, WEBHOOKS = "validation", "finalization", "webhooks"
# The singleton lease the planner's pass runs under.
PLANNER = "planner"
# The planner's period at least: its pass writes estimates, and it need not run faster.
PLAN_SECONDS = 1.0

_wakers: dict[tuple[str, str], list[tuple[asyncio.AbstractEventLoop, asyncio.Event]]] = {}
_wakers_lock = threading.Lock()


def wake(settings: Settings, loop_name: str) -> None:
    """Wakes one loop (validation, finalization, webhooks) of this process for this database."""
    with _wakers_lock:
        targets = list(_wakers.get((settings.sqlalchemy_url, loop_name), ()))
    for loop, event in targets:
        with contextlib.suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(event.set)


def _register(settings: Settings, loop_name: str, event: asyncio.Event) -> Callable[[], None]:
    key, entry = (settings.sqlalchemy_url, loop_name), (asyncio.get_running_loop(), event)
    with _wakers_lock:
        _wakers.setdefault(key, []).append(entry)

    def unregister() -> None:
        with _wakers_lock:
            _wakers[key].remove(entry)

    return unregister


def owner_name(role: str) -> str:
    """A lease owner id unique to this process."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _validate(settings: Settings, owner: str) -> None:
    if validate_pending(settings, owner):
        wake(settings, FINALIZATION)  # a batch cancelled while validating can now end
        wake(settings, WEBHOOKS)  # a batch that failed validation has an event to send


def plan(settings: Settings, owner: str) -> bool:
    """One planner pass (which batches are at risk, every open batch's ETA) if it is this
    process's turn: one replica plans at a time; False if another holds the planner's lease."""
    with session_scope(settings) as session:
        if not singleton_lease.hold(session, PLANNER, owner, settings.lease_seconds):
            return False
        replan(session, settings.scheduler, read_db_now(session))
        return True


def tidy(settings: Settings, owner: str) -> None:
    """One pass of everything but validation: finalize, expire uploads and files, sweep temp."""
    storage = storage_of(settings)
    if finalize_ready_batches(settings, owner, storage):
        wake(settings, WEBHOOKS)
    delete_leftover_chunks(settings, storage)
    with session_scope(settings) as session:
        now = int(read_db_now(session))  # expiry is judged by the database's clock
        expire_uploads(session, storage, now)
    with session_scope(settings) as session:
        expire_files(session, storage, now)
    storage.sweep_temp(STALE_TEMP_SECONDS)


async def housekeeping_loop(settings: Settings, stop: asyncio.Event) -> None:
    """Runs until `stop` is set; the API's lifespan starts it."""
    owner = owner_name("api")
    validate_wake, tidy_wake, deliver_wake = asyncio.Event(), asyncio.Event(), asyncio.Event()
    unregister = [
        _register(settings, VALIDATION, validate_wake),
        _register(settings, FINALIZATION, tidy_wake),
        _register(settings, WEBHOOKS, deliver_wake),
    ]
    try:
        await asyncio.gather(
            _repeat(settings, stop, validate_wake, _in_thread(_validate, settings, owner)),
            _repeat(settings, stop, tidy_wake, _in_thread(tidy, settings, owner)),
            _repeat(
                settings, stop, deliver_wake, lambda: deliver_due(settings, owner, deliver_wake.set)
            ),
            _repeat(
                settings, stop, asyncio.Event(), _in_thread(plan, settings, owner), PLAN_SECONDS
            ),
            _repeat(
                settings,
                stop,
                asyncio.Event(),
                _in_thread(retain, settings, owner),
                settings.retention_interval_seconds,
            ),
        )
    finally:
        for undo in unregister:
            undo()
        await senders(settings).drain()
        await asyncio.to_thread(_release_planner, settings, owner)


def _in_thread(
    step: Callable[[Settings, str], object], settings: Settings, owner: str
) -> Callable[[], Awaitable[object]]:
    """The step, run on the default executor at each call."""
    return lambda: asyncio.to_thread(step, settings, owner)


def _release_planner(settings: Settings, owner: str) -> None:
    """On shutdown: another replica takes the planner over at its next pass, not at expiry."""
    try:
        with session_scope(settings) as session:
            singleton_lease.release(session, PLANNER, owner)
    except Exception:
        log.exception("could not release the planner's lease; it lapses on its own")


async def _repeat(
    settings: Settings,
    stop: asyncio.Event,
    wake_event: asyncio.Event,
    step: Callable[[], Awaitable[object]],
    at_least: float = 0.0,
) -> None:
    while not stop.is_set():
        wake_event.clear()
        try:
            await step()
        except Exception:
            log.exception("housekeeping step failed; retrying at the next interval")
        await _sleep(stop, wake_event, max(settings.housekeeping_interval_seconds, at_least))


async def _sleep(stop: asyncio.Event, wake_event: asyncio.Event, seconds: float) -> None:
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(wake_event.wait())]
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
