"""Online first: the batch window shrinks while online requests are in the engine.

vLLM's priority scheduler already admits a waiting online request before any waiting batch
request, but it does not stop running ones: every engine step still carries every running
batch sequence, and on a small machine that step time is the online request's latency. So
while online requests wait or run, at most `busy_window` batch requests stay in flight (the
newest beyond it are preempted: aborted and queued again, first in line).

The window grows back only when the next online request is unlikely to come soon: once the
quiet has lasted `quiet_gaps` times the mean gap between recent arrivals (at least
`quiet_seconds`, at most `MAX_QUIET_SECONDS`), and then step by step, doubling every
`regrow_seconds`. A request that arrives during the regrowth meets a few more batch
prefills, not the full window's hundreds of them in one engine step.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from worker.scheduler import Scheduler
from worker.traffic import OnlineTraffic

log = logging.getLogger("overnight.worker")

MAX_QUIET_SECONDS = 30.0


@dataclass(frozen=True)
class BackoffPolicy:
    busy_window: int
    quiet_seconds: float = 1.0
    quiet_gaps: float = 5.0
    regrow_seconds: float = 0.5
    preempt: bool = True

    def hold(self, mean_gap: float | None) -> float:
        """How long online traffic must be quiet before the window starts to grow back."""
        if mean_gap is None:
            return self.quiet_seconds
        return min(max(self.quiet_seconds, self.quiet_gaps * mean_gap), MAX_QUIET_SECONDS)


def target_window(
    policy: BackoffPolicy, full: int, active: int, quiet_for: float, mean_gap: float | None = None
) -> int:
    """The batch window for this moment: small while online requests are (recently) there."""
    busy = max(1, min(full, policy.busy_window))
    grown_for = quiet_for - policy.hold(mean_gap)
    if active or grown_for < 0:
        return busy
    steps = full.bit_length()  # doublings from 1 to beyond any window
    if grown_for >= policy.regrow_seconds * steps:  # also infinity: quiet from the start
        return full
    return min(full, busy << (1 + int(grown_for / policy.regrow_seconds)))


def next_change(policy: BackoffPolicy, quiet_for: float, mean_gap: float | None) -> float:
    """Seconds until target_window would next grow, for a quiet engine."""
    grown_for = quiet_for - policy.hold(mean_gap)
    if grown_for < 0 or policy.regrow_seconds <= 0:
        return max(-grown_for, 0.0)
    return policy.regrow_seconds - grown_for % policy.regrow_seconds


async def follow_online_traffic(
    traffic: OnlineTraffic, scheduler: Scheduler, policy: BackoffPolicy
) -> None:
    """Resize the scheduler's window as online requests come and go (runs until cancelled)."""
    full = scheduler.window
    while True:
        traffic.changed.clear()
        quiet_for = traffic.quiet_for()
        window = target_window(policy, full, traffic.active, quiet_for, traffic.mean_gap)
        if window != scheduler.window:
            shrinking = window < scheduler.window
            preempted = await scheduler.resize(window, preempt=shrinking and policy.preempt)
            if preempted:
                log.debug("online requests: %d batch requests preempted", preempted)
        hold = None
        if not traffic.active and scheduler.window < full:
            hold = next_change(policy, quiet_for, traffic.mean_gap)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(traffic.changed.wait(), hold)
