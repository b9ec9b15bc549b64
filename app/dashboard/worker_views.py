"""The workers page, a worker's page, online usage and the overview's fleet figures."""

import time
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import orjson

from app.dashboard.display import DASH, Row, fmt_duration, fmt_time
from app.db.models import RegisteredWorker, Shard
from app.schemas.admin import WorkerState
from app.schemas.models import SWITCHING_KEY, announcement_in
from app.services.fleet import SERVING_STATES, Fleet
from app.services.monitoring import WorkerView
from app.services.online_usage import UsageRow


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
    """The names a worker serves and their endpoints, as its row announces them, and for a
    switching worker the models it switches between."""
    served = announcement_in(w.engine_configuration)
    switches = _switches((w.engine_configuration or {}).get(SWITCHING_KEY))
    if served is None or not served.names:
        return {"model": w.model, "endpoints": DASH, "switches": switches}
    names, endpoints = ", ".join(served.names), ", ".join(served.endpoints) or DASH
    return {"model": names, "endpoints": endpoints, "switches": switches}


def _switches(shown: dict[str, Any] | None) -> str:
    """`--models`: which it holds of which, how often it switched and what loading costs."""
    if not shown:
        return DASH
    loads = ", ".join(f"{m} {fmt_duration(s)}" for m, s in shown["load_seconds"].items())
    return (
        f"holds {shown['holding']} of {', '.join(shown['models'])} by demand; "
        f"{shown['switches']} switch{'' if shown['switches'] == 1 else 'es'}, "
        f"{fmt_duration(shown['switch_seconds'])} switching; "
        f"loads in {loads or DASH}"
    )


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
