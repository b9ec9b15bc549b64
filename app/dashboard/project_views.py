"""What belongs to projects: files (and a file's preview), keys, webhooks, limits and quotas."""

from typing import Any

from app.core.sizes import human_bytes
from app.core.webhook_signing import secret_hint
from app.dashboard.display import DASH, Row, file_href, fmt_time
from app.db.models import File, WebhookEndpoint
from app.schemas.admin import EnqueuedLimitsObject, ProjectQuotasObject, Quota
from app.services.files import Preview


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
