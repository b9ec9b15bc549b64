"""The batches page and a batch's page: rows, progress bars, timeline and estimates."""

from app.core.progress import Outcomes
from app.core.states import (
    CANCELLABLE_BATCH_STATUSES,
    TERMINAL_BATCH_STATUSES,
    BatchApi,
    BatchStatus,
)
from app.dashboard.display import DASH, Row, file_href, fmt_duration, fmt_time
from app.db.models import BatchSchedule, File
from app.services.monitoring import BatchView

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

API_NAMES = {BatchApi.OPENAI: "OpenAI Batch API", BatchApi.ANTHROPIC: "Anthropic Message Batches"}


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
        "api": API_NAMES[view.batch.api],
        "message_batch": view.batch.api == BatchApi.ANTHROPIC,
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


def batch_detail(
    view: BatchView, planned: BatchSchedule | None, files: dict[str, File], now: float
) -> Row:
    """The batch page: its row plus timeline, usage, errors, metadata, the planner's estimate
    (`planned`, None before the batch was admitted) and file links."""
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
    detail.update(schedule_fields(b.status, planned))
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


def schedule_fields(status: BatchStatus, planned: BatchSchedule | None) -> Row:
    """The planner's estimate for an open batch (app/services/schedule.py)."""
    open_ = status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS)
    if not open_ or planned is None or planned.eta_finish_at is None:
        return {"est_start": DASH, "est_finish": DASH, "deadline": DASH}
    deadline = "on time"
    if planned.expected_miss:
        deadline = "expected to miss"
    elif planned.urgent_deadline is not None:
        deadline = "at risk: served first"
    return {
        "est_start": fmt_time(planned.eta_start_at),
        "est_finish": fmt_time(planned.eta_finish_at),
        "deadline": deadline,
    }
