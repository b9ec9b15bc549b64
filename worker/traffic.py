"""Online requests inside the engine: how many wait or run now, and what each project used.

The online API marks its requests with the caller's project (a context variable set by its
authentication); the engine adapter reports each marked engine request here as it enters
the engine, produces its first output and ends. Batch requests are never marked, so they
cost nothing here.
"""

import asyncio
import time
from collections import defaultdict
from contextvars import ContextVar
from dataclasses import dataclass

GAP_WEIGHT = 0.2  # of the newest gap in the moving mean: about the last ten arrivals count
ONLINE_PROJECT: ContextVar[str | None] = ContextVar("overnight_online_project", default=None)


@dataclass
class UsageTally:
    """One project's online use since the last flush."""

    requests: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0

    def add(self, other: "UsageTally") -> None:
        self.requests += other.requests
        self.input_tokens += other.input_tokens
        self.cached_tokens += other.cached_tokens
        self.output_tokens += other.output_tokens


class OnlineTraffic:
    """Online engine requests waiting (no output yet) or running, and usage per project."""

    def __init__(self) -> None:
        self.waiting = 0
        self.running = 0
        self.quiet_since = float("-inf")  # quiet from the start
        self.mean_gap: float | None = None  # seconds between recent arrivals, None before two
        self._last_arrival: float | None = None
        self.changed = asyncio.Event()
        self._usage: defaultdict[str, UsageTally] = defaultdict(UsageTally)

    @property
    def active(self) -> int:
        return self.waiting + self.running

    def quiet_for(self, now: float | None = None) -> float:
        """Seconds since the last online request left the engine; 0 while any is in it."""
        if self.active:
            return 0.0
        return (time.monotonic() if now is None else now) - self.quiet_since

    def arrived(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self._last_arrival is not None:
            gap = now - self._last_arrival
            self.mean_gap = (
                gap
                if self.mean_gap is None
                else (1 - GAP_WEIGHT) * self.mean_gap + GAP_WEIGHT * gap
            )
        self._last_arrival = now
        self.waiting += 1
        self.changed.set()

    def started(self) -> None:
        self.waiting -= 1
        self.running += 1

    def left(self, project: str, started: bool, usage: UsageTally) -> None:
        if started:
            self.running -= 1
        else:
            self.waiting -= 1
        if not self.active:
            self.quiet_since = time.monotonic()
        self._usage[project].add(usage)
        self.changed.set()

    def take_usage(self) -> dict[str, UsageTally]:
        """What each project used since the last call (for the database)."""
        taken, self._usage = dict(self._usage), defaultdict(UsageTally)
        return taken

    def give_back(self, usage: dict[str, UsageTally]) -> None:
        """Usage a failed flush could not record: it goes with the next one."""
        for project, used in usage.items():
            self._usage[project].add(used)
