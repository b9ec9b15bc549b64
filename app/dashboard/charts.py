"""The throughput charts' caption and axes (a batch's page and the overview)."""

import math
from datetime import UTC, datetime

from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.dashboard.display import Row, fmt_duration, fmt_time


def chart_caption(series: list[tuple[float, float]], status: BatchStatus) -> str:
    if not series:
        if status in TERMINAL_BATCH_STATUSES:
            return "No request ran in this batch."
        return "No results recorded yet."
    span = series[-1][0] - series[0][0]
    peak = max(rate for _t, rate in series)
    return f"Peak {peak:.1f} requests/s, over {fmt_duration(span)} from {fmt_time(series[0][0])}."


def chart_axes(series: list[tuple[float, float]], clock: str = "%H:%M:%S") -> Row:
    """The bars' scale and the labels of both axes, for the template and the feed alike."""
    top = nice_ceiling(max((rate for _t, rate in series), default=0.0))
    start = end = mid = None
    if series:
        # Each point is a bar as wide as the spacing: the axis runs to the last bar's end.
        step = series[1][0] - series[0][0] if len(series) > 1 else 1.0
        start, end = series[0][0], series[-1][0] + step
        mid = (start + end) / 2

    def at(ts: float | None) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime(clock) if ts is not None else ""

    return {
        "y_max": top,
        "y_top": f"{top:g}",
        "y_mid": f"{top / 2:g}",
        "x_start": at(start),
        "x_mid": at(mid),
        "x_end": at(end),
    }


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times 10^k at or above `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value * (1 - 1e-9))
