"""What the dashboard shows, as flat dicts of display values.

Templates render them on the first load and the page script fills the same keys
from the JSON feeds afterwards, so both paths show identical text. Values are
plain data: Jinja escapes them and the script only ever sets `textContent`.
"""

import math
import time
from collections import Counter
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import orjson

from app.core.progress import Outcomes
from app.core.sizes import human_bytes
from app.core.states import CANCELLABLE_BATCH_STATUSES, TERMINAL_BATCH_STATUSES, BatchStatus
from app.core.webhook_signing import secret_hint
from app.db.models import Batch, File, RegisteredWorker, Shard, WebhookEndpoint
from app.schemas.admin import EnqueuedLimitsObject, ProjectQuotasObject, Quota, WorkerState
from app.schemas.models import announcement_in
from app.services.files import Preview
from app.services.fleet import SERVING_STATES, Fleet
from app.services.monitoring import BatchView, WorkerView
from app.services.online_usage import UsageRow

Row = dict[str, Any]
DASH = "—"
TIMELINE = (
    ("created_at", "Created"),
    ("in_progress_at", "In progress"),
    ("finalizing_at", "Finalizing"),
    ("completed_at", "Completed"),
    ("failed_at", "Failed"),
    ("cancelling_at", "Cancelling"),
    ("cancelled_at", "Cancelled"),
    ("expired_at", "Expired"),
    ("expires_at", "Expires"),
)


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return DASH
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return DASH
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    minutes, whole = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {whole:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h {minutes:02d}m"
    return f"{hours // 24}d {hours % 24}h"


def file_href(file_id: str | None) -> str:
    return f"/dashboard/files/{file_id}/content" if file_id else ""


def batch_row(view: BatchView, now: float) -> Row:
    counts = view.wire.request_counts
    outcomes = view.outcomes
    status = view.batch.status
    if counts.total:
        pct = 100.0 * view.done / counts.total
    else:
        pct = 100.0 if status in TERMINAL_BATCH_STATUSES and status != BatchStatus.FAILED else 0.0
    ended = ended_at(view)
    return {
        "id": view.batch.id,
        "href": f"/dashboard/batches/{view.batch.id}",
        "status": status,
        "reason": failure_reason(view),
        "project": view.project_name,
        "model": view.batch.model or DASH,
        "endpoint": view.batch.endpoint,
        "completed": outcomes.completed,
        "failed": outcomes.failed,
        "cancelled": outcomes.cancelled,
        "expired": outcomes.expired,
        "total": counts.total,
        "progress_pct": round(pct, 1),
        "progress": f"{pct:.0f}%",
        "segments": segments(outcomes, counts.total),
        "throughput": str(view.throughput(now)),
        "eta": fmt_duration(view.eta_seconds(now)),
        "duration": fmt_duration(None if ended is None else ended - view.batch.created_at),
        "age": fmt_duration(now - view.batch.created_at),
        "created": fmt_time(view.batch.created_at),
        "cancellable": status in CANCELLABLE_BATCH_STATUSES,
    }


def ended_at(view: BatchView) -> int | None:
    b = view.batch
    return b.completed_at or b.failed_at or b.cancelled_at or b.expired_at


def failure_reason(view: BatchView) -> str:
    """Why a batch failed or expired, in a line; empty for the others."""
    b, errors = view.batch, view.wire.errors
    if b.status == BatchStatus.FAILED and errors and errors.data:
        first = errors.data[0]
        where = f"line {first.line}: " if first.line is not None else ""
        more = f" (+{len(errors.data) - 1} more)" if len(errors.data) > 1 else ""
        return f"{where}{first.message}{more}"
    if b.status == BatchStatus.FAILED:
        return "failed"
    if b.status == BatchStatus.EXPIRED:
        return f"the {b.completion_window} completion window ended before every request ran"
    return ""


def segments(outcomes: Outcomes, total: int) -> list[Row]:
    """The stacked bar: completed, failed, then cancelled or expired, as % of the total."""
    unrun = outcomes.cancelled + outcomes.expired
    parts = (("completed", outcomes.completed), ("failed", outcomes.failed), ("unrun", unrun))
    x, found = 0.0, []
    for kind, n in parts:
        width = 100.0 * n / total if total else 0.0
        found.append({"kind": kind, "x": round(x, 3), "width": round(width, 3)})
        x += width
    return found


def batch_detail(view: BatchView, files: dict[str, File], now: float) -> Row:
    """The batch page: its row plus timeline, usage, errors, metadata and file links."""
    b, usage = view.batch, view.wire.usage
    detail = batch_row(view, now)
    detail["timeline"] = [
        {"label": label, "time": fmt_time(getattr(b, attr))}
        for attr, label in TIMELINE
        if getattr(b, attr) is not None or attr in ("created_at", "expires_at")
    ]
    detail["errors"] = [
        {
            "line": DASH if e.line is None else str(e.line),
            "code": e.code,
            "param": e.param or DASH,
            "message": e.message,
        }
        for e in (view.wire.errors.data if view.wire.errors else [])
    ]
    detail["has_errors"] = bool(detail["errors"])
    detail["metadata"] = [{"key": k, "value": str(v)} for k, v in (b.metadata_ or {}).items()]
    detail["retryable"] = b.status in TERMINAL_BATCH_STATUSES and b.error_file_id is not None
    detail.update(schedule_fields(b))
    for kind, file_id in (
        ("input", b.input_file_id),
        ("output", b.output_file_id),
        ("error", b.error_file_id),
    ):
        f = files.get(file_id or "")
        detail[f"{kind}_file_id"] = file_id or ""
        detail[f"{kind}_href"] = file_href(file_id) if f is not None else ""
        detail[f"{kind}_name"] = f.filename if f is not None else DASH
    detail.update(
        input_tokens=usage.input_tokens,
        cached_tokens=usage.input_tokens_details.cached_tokens,
        output_tokens=usage.output_tokens,
        reasoning_tokens=usage.output_tokens_details.reasoning_tokens,
        total_tokens=usage.total_tokens,
    )
    return detail


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


def worker_row(view: WorkerView) -> Row:
    w: RegisteredWorker = view.worker
    return {
        "id": w.id,
        "href": f"/dashboard/workers/{quote(w.id, safe='')}",
        "host": w.host,
        "pid": w.pid,
        **_serves(w),
        "state": view.state,
        "heartbeat_age": fmt_duration(view.heartbeat_age),
        "batch_href": f"/dashboard/batches/{view.batch_id}" if view.batch_id else "",
        "shard": f"{view.batch_id} #{view.shard_index}" if view.batch_id else DASH,
        "tokens_per_second": f"{w.tokens_per_second:.1f}",
        "started": fmt_time(w.started_at),
        "uptime": uptime(view, time.time()),
    }


def _serves(w: RegisteredWorker) -> Row:
    """The names a worker serves and their endpoints, as its row announces them."""
    served = announcement_in(w.engine_configuration)
    if served is None:
        return {"model": w.model, "endpoints": DASH}
    return {"model": ", ".join(served.names), "endpoints": ", ".join(served.endpoints) or DASH}


def uptime(view: WorkerView, now: float) -> str:
    """How long it has served; a loading one how long it has loaded; else since when it is gone."""
    w = view.worker
    if view.state == WorkerState.STOPPED and w.stopped_at is not None:
        return f"stopped {fmt_duration(now - w.stopped_at)} ago"
    if view.state == WorkerState.STALE:
        return f"silent {fmt_duration(view.heartbeat_age)}"
    if view.state == WorkerState.LOADING:
        return f"loading {fmt_duration(now - w.started_at)}"
    return fmt_duration(now - (w.ready_at or w.started_at))


def online_row(usage: UsageRow) -> Row:
    return {
        "project": usage.project,
        "model": usage.model,
        "requests": f"{usage.requests:,}",
        "input_tokens": f"{usage.input_tokens:,}",
        "output_tokens": f"{usage.output_tokens:,}",
    }


def worker_detail(view: WorkerView, shards: Sequence[Shard], now: float) -> Row:
    """The worker page: its row, its engine's gauges and configuration, its recent shards."""
    w = view.worker
    detail = worker_row(view)
    live = view.state not in (WorkerState.STOPPED, WorkerState.STALE)
    usage = 100.0 * w.kv_cache_usage if live else 0.0
    configuration = w.engine_configuration or {}
    detail.update(
        feed=f"/dashboard/api/workers/{quote(w.id, safe='')}",
        engine_running=w.engine_running if live else 0,
        engine_waiting=w.engine_waiting if live else 0,
        kv_cache_pct=round(usage, 1),
        kv_cache=f"{usage:.1f}%" if live else DASH,
        effective=_pairs(configuration.get("effective", {})),
        arguments=_pairs(configuration.get("arguments", {})),
        stopped=fmt_time(w.stopped_at),
        shards=[_shard_row(shard, now) for shard in shards],
    )
    return detail


def _pairs(values: dict[str, Any]) -> list[Row]:
    return [
        {"key": key, "value": value if isinstance(value, str) else orjson.dumps(value).decode()}
        for key, value in values.items()
    ]


def _shard_row(shard: Shard, now: float) -> Row:
    last = shard.first_line + shard.line_count - 1
    return {
        "id": f"{shard.batch_id}#{shard.index}",
        "batch": shard.batch_id,
        "batch_href": f"/dashboard/batches/{shard.batch_id}",
        "index": shard.index,
        "lines": f"{shard.first_line}-{last}",
        "status": shard.status,
        "completed": shard.completed,
        "failed": shard.failed,
        "attempts": shard.attempts,
        "seen": fmt_duration(now - shard.heartbeat_at) if shard.heartbeat_at else DASH,
    }


def webhook_row(endpoint: WebhookEndpoint, project_name: str, deliveries: list[Any]) -> Row:
    """An endpoint with its recent deliveries (`WebhookDelivery` rows, newest first)."""
    base = f"/dashboard/api/webhooks/{endpoint.id}"
    return {
        "id": endpoint.id,
        "name": endpoint.name,
        "url": endpoint.url,
        "project": project_name,
        "event_types": list(endpoint.event_types),
        "events": ", ".join(endpoint.event_types),
        "enabled": endpoint.enabled,
        "state": "enabled" if endpoint.enabled else "disabled",
        "toggle_label": "Disable" if endpoint.enabled else "Enable",
        "toggle_url": f"{base}/{'disable' if endpoint.enabled else 'enable'}",
        "update_url": base,
        "delete_url": f"{base}/delete",
        "rotate_url": f"{base}/rotate",
        "test_url": f"{base}/test",
        "secret_hint": secret_hint(endpoint.secret),
        "created": fmt_time(endpoint.created_at),
        "deliveries": [_delivery_row(d) for d in deliveries],
    }


def _delivery_row(d: Any) -> Row:
    return {
        "id": d.id,
        "event_type": d.event_type,
        "status": d.status,
        "attempts": d.attempts,
        "http": DASH if d.last_status_code is None else str(d.last_status_code),
        "latency": DASH if d.latency_ms is None else f"{d.latency_ms:.0f} ms",
        "last_error": d.last_error or DASH,
        "created": fmt_time(d.created_at),
    }


def file_row(f: File, project_name: str) -> Row:
    return {
        "id": f.id,
        "filename": f.filename,
        "purpose": f.purpose,
        "project": project_name,
        "bytes": human_bytes(f.bytes),
        "created": fmt_time(f.created_at),
        "expires": fmt_time(f.expires_at),
        "href": file_href(f.id),
        "delete_url": f"/dashboard/api/files/{f.id}/delete",
    }


def key_row(key: Any) -> Row:
    """From the admin API's `ApiKeyObject`."""
    return {
        "id": key.id,
        "project": key.project_name,
        "name": key.name or DASH,
        "role": key.role,
        "redacted": key.redacted_value,
        "created": fmt_time(key.created_at),
        "revoke_url": f"/dashboard/api/keys/{key.id}/revoke",
    }


def limits_line(limits: EnqueuedLimitsObject) -> str:
    """`model: 2,000,000 tokens (own), unlimited requests (default)`."""

    def one(limit: int | None, own: int | None, unit: str) -> str:
        shown = f"{limit:,} {unit}" if limit is not None else f"unlimited {unit}"
        return f"{shown} ({'own' if own is not None else 'default'})"

    tokens = one(limits.token_limit, limits.token_limit_override, "tokens")
    requests = one(limits.request_limit, limits.request_limit_override, "requests")
    return f"{limits.model}: {tokens}, {requests}"


def quota_lines(found: ProjectQuotasObject) -> list[str]:
    """`files: 3 of 1,000 (own)`, one a quota: what the project holds against its limit."""
    lines = []
    for quota in Quota:
        held = getattr(found, quota)
        limit = f"{held.limit:,}" if held.limit is not None else "unlimited"
        source = "own" if held.override is not None else "default"
        lines.append(f"{quota.replace('_', ' ')}: {held.used:,} of {limit} ({source})")
    return lines


def preview(p: Preview) -> Row:
    shown = len(p.lines)
    size = human_bytes(p.total_bytes)
    what = "the whole file" if p.complete else f"the first {shown} lines of {size}"
    return {
        "lines": [{"id": n, "n": n, "text": text} for n, text in p.lines],
        "caption": f"Showing {what}." if shown else "The file is empty.",
    }


def fleet_overview(f: Fleet) -> Row:
    """The overview page's figures (the chart is added by the caller)."""
    up = sum(f.workers[s] for s in SERVING_STATES)
    return {
        "workers_up": up,
        "workers_loading": f.workers[WorkerState.LOADING],
        "workers_stale": f.workers[WorkerState.STALE],
        "queued_requests": sum(q.queued_requests for q in f.models),
        "tokens_per_second": f"{f.tokens_per_second:.1f} tok/s",
        "models": [
            {
                "id": q.model or DASH,
                "model": q.model or DASH,
                "queued": q.queued_requests,
                "running_batches": q.running_batches,
                "validating_batches": q.validating_batches,
                "workers": _worker_counts(q.workers),
            }
            for q in f.models
        ],
        "projects": [
            {
                "id": p.project,
                "project": p.project,
                "batches": p.batches,
                "input_tokens": f"{p.input_tokens:,}",
                "output_tokens": f"{p.output_tokens:,}",
                "total_tokens": f"{p.input_tokens + p.output_tokens:,}",
            }
            for p in f.tokens_today
        ],
    }


def _worker_counts(states: Counter[WorkerState]) -> str:
    parts = [f"{states[s]} {s}" for s in WorkerState if states[s]]
    return ", ".join(parts) if parts else "none"


def schedule_fields(b: Batch) -> Row:
    """The planner's estimate for an open batch (app/services/schedule.py)."""
    open_ = b.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    if not open_ or b.eta_finish_at is None:
        return {"est_start": DASH, "est_finish": DASH, "deadline": DASH}
    deadline = "on time"
    if b.expected_miss:
        deadline = "expected to miss"
    elif b.urgent_deadline is not None:
        deadline = "at risk: served first"
    return {
        "est_start": fmt_time(b.eta_start_at),
        "est_finish": fmt_time(b.eta_finish_at),
        "deadline": deadline,
    }
