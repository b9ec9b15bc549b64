"""The scheduling rule, as a model: what work is, and where each batch lands in the schedule.

Workers claim shards in the order `worker/claim.py` gives (at-risk deadlines first, earliest
first; then the project with the least work served per unit of weight; then, inside the
project, the batch with the least work served; then the oldest). `plan` replays that rule
as a fluid model of one model's workers running at their measured speed: projects share by
weight, a project's batches share equally, batches at risk take the whole fleet in
earliest-deadline order. From it come each batch's estimated start and finish, and the
batches at risk: those that would finish after `expires_at` under fair share. A batch once
at risk stays so (it would flap otherwise); those that miss even then are expected to miss.
"""

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from app.core.progress import Progress

# A batch with less work left than this counts as finished in the fluid model.
_EPSILON = 1e-9


class Order(StrEnum):
    """`OVERNIGHT_SCHEDULER`: `fair` (the rule above) or `fifo` (oldest batch first)."""

    FAIR = "fair"
    FIFO = "fifo"


def work_of(progress: Progress) -> int:
    """Work, as throughput counts it: output tokens, else input tokens, else requests."""
    return progress.output_tokens or progress.input_tokens or progress.completed + progress.failed


def recorded_speed(records: list[tuple[float, float]]) -> float:
    """Work per second from result chunks' `(recorded at, work)`; 0 until two moments are known.

    A chunk holds the work done since its shard's previous chunk, so the first one's work was
    done before the first moment: it marks where the measured time starts and its work is
    left out (counting it divided the first seconds' work by too short a time, and a model
    that had just started looked several times faster than it was). The time runs to the
    last chunk, as work after it is not recorded yet.
    """
    records = sorted(records)
    first, last = records[0][0], records[-1][0]
    if last <= first:
        return 0.0
    return sum(work for at, work in records if at > first) / (last - first)


@dataclass(frozen=True)
class Demand:
    """What one open batch still needs from its model's workers."""

    batch_id: str
    project_id: str
    weight: float
    seq: int
    expires_at: float
    remaining_work: float
    started: bool
    at_risk: bool


@dataclass(frozen=True)
class Estimate:
    batch_id: str
    position: int  # 1 is served first
    start_at: float
    finish_at: float
    at_risk: bool
    expected_miss: bool


def _rates(open_: list[Demand], order: Order, speed: float) -> dict[str, float]:
    """How the fleet's speed is split between open batches right now."""
    if order is Order.FIFO:
        first = min(open_, key=lambda d: d.seq)
        return {first.batch_id: speed}
    urgent = [d for d in open_ if d.at_risk]
    if urgent:
        first = min(urgent, key=lambda d: (d.expires_at, d.seq))
        return {first.batch_id: speed}
    by_project: dict[str, list[Demand]] = defaultdict(list)
    for d in open_:
        by_project[d.project_id].append(d)
    weights = {p: batches[0].weight for p, batches in by_project.items()}
    total = sum(weights.values())
    return {
        d.batch_id: speed * weights[p] / total / len(batches)
        for p, batches in by_project.items()
        for d in batches
    }


def simulate(
    demands: Sequence[Demand], order: Order, speed: float, now: float
) -> dict[str, tuple[float, float]]:
    """Each batch's (start, finish) when the fleet runs at `speed` work/s from `now` on."""
    left = {d.batch_id: d.remaining_work for d in demands}
    start = {d.batch_id: now for d in demands if d.started}
    finish: dict[str, float] = {}
    t = now
    while open_ := [d for d in demands if d.batch_id not in finish]:
        rates = _rates(open_, order, speed)
        for batch_id in rates:
            start.setdefault(batch_id, t)
        step = min(left[b] / r for b, r in rates.items() if r > 0)
        t += step
        for batch_id, rate in rates.items():
            left[batch_id] -= rate * step
            if left[batch_id] <= _EPSILON * max(rate, 1.0):
                finish[batch_id] = t
    return {b: (start[b], finish[b]) for b in finish}


def plan(demands: Sequence[Demand], order: Order, speed: float, now: float) -> list[Estimate]:
    """The schedule of one model's open batches, in the order they are served first."""
    if speed <= 0 or not demands:
        return []
    current = list(demands)
    while True:
        times = simulate(current, order, speed, now)
        late = {d.batch_id for d in current if times[d.batch_id][1] > d.expires_at}
        newly = [d for d in current if d.batch_id in late and not d.at_risk]
        if order is Order.FIFO or not newly:
            break
        current = [replace(d, at_risk=True) if d.batch_id in late else d for d in current]
    ranked = sorted(current, key=lambda d: (times[d.batch_id][0], d.seq))
    return [
        Estimate(
            batch_id=d.batch_id,
            position=i,
            start_at=times[d.batch_id][0],
            finish_at=times[d.batch_id][1],
            at_risk=d.at_risk,
            expected_miss=d.batch_id in late,
        )
        for i, d in enumerate(ranked, start=1)
    ]
