"""Where webhook attempts run, and how many at once: a slow receiver holds its own slots only.

An attempt is an async request on the API's event loop; its host's lookup and the outbox's
transactions run on threads of the senders' own, never on the default executor that
validation, finalization and the planner step on. Per event loop (an API process has one),
at most `webhook_senders` attempts are in flight, and `webhook_sends_per_endpoint` to any
one endpoint, whether the deliverer or a test event started them.
"""

import asyncio
import functools
import logging
import weakref
from collections import Counter
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

from app.config import Settings

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger("overnight.webhooks")


class Room:
    """The free slots as a claim sees them: its own copy, which it takes from as it claims."""

    def __init__(self, free: int, per_endpoint: int, in_flight: Counter[str]) -> None:
        self.free = free
        self.per_endpoint = per_endpoint
        self.in_flight = in_flight

    def full(self) -> list[str]:
        """The endpoints that may have no more attempts in flight."""
        return [e for e, n in self.in_flight.items() if n >= self.per_endpoint]

    def take(self, endpoint_id: str) -> bool:
        """One slot for the endpoint, if there is one."""
        if self.free <= 0 or self.in_flight[endpoint_id] >= self.per_endpoint:
            return False
        self.free -= 1
        self.in_flight[endpoint_id] += 1
        return True


class Senders:
    """One event loop's webhook attempts: their slots, their threads, their tasks."""

    def __init__(self, total: int, per_endpoint: int) -> None:
        self.total, self.per_endpoint = total, per_endpoint
        # A thread for each attempt in flight (its lookup, then its record) and one for the
        # deliverer's claim: an attempt never queues for a thread behind another's.
        self._threads = ThreadPoolExecutor(total + 1, thread_name_prefix="overnight-webhook")
        self._in_flight: Counter[str] = Counter()
        self._reserved = 0
        self._freed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()

    def free(self) -> int:
        return self.total - self._in_flight.total() - self._reserved

    async def in_thread(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(…)` on the senders' own threads."""
        call = functools.partial(fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._threads, call)

    def reserve(self) -> Room:
        """Every free slot, held for a claim until `unreserve`: what it starts takes them."""
        room = Room(self.free(), self.per_endpoint, Counter(self._in_flight))
        self._reserved += room.free
        return room

    def unreserve(self, room: Room) -> None:
        """Gives back what the claim left of its room."""
        self._reserved -= room.free
        self._freed.set()

    def start(self, endpoint_id: str, attempt: Coroutine[Any, Any, None]) -> None:
        """Runs `attempt` as a task in a slot of the endpoint's that the caller reserved."""
        self._reserved -= 1
        self._take(endpoint_id)
        task = asyncio.create_task(self._in_slot(endpoint_id, attempt))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def acquire(self, endpoint_id: str, deadline: float) -> bool:
        """A slot for the endpoint (`release` it), once one is free; False if `deadline`
        (the event loop's clock) comes first."""
        try:
            async with asyncio.timeout_at(deadline):
                while self.free() <= 0 or self._in_flight[endpoint_id] >= self.per_endpoint:
                    self._freed.clear()
                    await self._freed.wait()
        except TimeoutError:
            return False
        self._take(endpoint_id)
        return True

    def release(self, endpoint_id: str) -> None:
        self._in_flight[endpoint_id] -= 1
        if self._in_flight[endpoint_id] <= 0:
            del self._in_flight[endpoint_id]
        self._freed.set()

    async def drain(self) -> None:
        """Waits for the attempts in flight, each of which ends by its deadline."""
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _take(self, endpoint_id: str) -> None:
        self._in_flight[endpoint_id] += 1

    async def _in_slot(self, endpoint_id: str, attempt: Coroutine[Any, Any, None]) -> None:
        try:
            await attempt
        except Exception:
            log.exception("a webhook attempt to %s failed", endpoint_id)
        finally:
            self.release(endpoint_id)


_BY_LOOP: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Senders]" = (
    weakref.WeakKeyDictionary()
)


def senders(settings: Settings) -> Senders:
    """The running event loop's senders, which its routes and its deliverer share."""
    loop = asyncio.get_running_loop()
    found = _BY_LOOP.get(loop)
    if found is None:
        found = Senders(settings.webhook_senders, settings.webhook_sends_per_endpoint)
        _BY_LOOP[loop] = found
    return found
