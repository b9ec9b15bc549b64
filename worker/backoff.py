"""Online first: the batch window shrinks while online requests are in the engine.

vLLM's priority scheduler already admits a waiting online request before any waiting batch
request, but it does not stop running ones: every engine step still carries every running
batch sequence, and on a small machine that step time is the online request's latency. So
while online requests wait or run, at most `busy_window` batch requests stay in flight (the
newest beyond it are preempted: aborted and queued again, first in line), and the full window
comes back once online traffic has been quiet for `quiet_seconds`.
"""

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from worker.scheduler import Scheduler
from worker.traffic import OnlineTraffic

log = logging.getLogger("overnight.worker")


@dataclass(frozen=True)
class BackoffPolicy:
    busy_window: int
    quiet_seconds: float = 1.0
    preempt: bool = True


def target_window(policy: BackoffPolicy, full: int, active: int, quiet_for: float) -> int:
    """The batch window for this moment: small while online requests are (recently) there."""
    if active or quiet_for < policy.quiet_seconds:
        return min(full, policy.busy_window)
    return full


async def follow_online_traffic(
    traffic: OnlineTraffic, scheduler: Scheduler, policy: BackoffPolicy
) -> None:
    """Resize the scheduler's window as online requests come and go (runs until cancelled)."""
    full = scheduler.window
    while True:
        traffic.changed.clear()
        window = target_window(policy, full, traffic.active, traffic.quiet_for())
        if window != scheduler.window:
            shrinking = window < scheduler.window
            preempted = await scheduler.resize(window, preempt=shrinking and policy.preempt)
            if preempted:
                log.debug("online requests: %d batch requests preempted", preempted)
        hold = None
        if not traffic.active and scheduler.window < full:
            hold = max(policy.quiet_seconds - traffic.quiet_for(), 0.0)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(traffic.changed.wait(), hold)
