"""What each dashboard page and feed shows, read through the services in one transaction."""

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy.orm import Session

from app.config import Settings
from app.core.sizes import human_bytes
from app.dashboard import batch_views, charts, project_views, worker_views
from app.dashboard.display import Row
from app.errors import OpenAIError, not_found
from app.services import (
    enqueued,
    file_expiry,
    keys,
    monitoring,
    online_usage,
    quotas,
    schedule,
    webhook_endpoints,
)
from app.services.batch_search import find_custom_id
from app.services.files import open_file_content, preview_file
from app.services.result_series import deployment_series, throughput_series
from app.services.stats import Stats
from app.storage import Storage

PAGE_SIZE = 100
OVERVIEW_WINDOW_SECONDS = 3600.0


@dataclass(frozen=True)
class BatchQuery:
    """The batch list's form: filters, a search, a date range (UTC days) and the cursor."""

    status: str = ""
    project: str = ""
    q: str = ""  # a batch id or text in a metadata value
    custom_id: str = ""
    date_from: str = ""  # YYYY-MM-DD
    date_to: str = ""
    after: str = ""
    limit: int = PAGE_SIZE

    def where(self) -> monitoring.BatchFilter:
        until = _day(self.date_to, "to")
        return monitoring.BatchFilter(
            status=self.status or None,
            project_id=self.project or None,
            search=self.q.strip() or None,
            created_from=_day(self.date_from, "from"),
            created_before=None if until is None else until + 86400,
            after=self.after or None,
        )

    def href(self, after: str) -> str:
        fields = {**asdict(self), "after": after}
        if self.limit == PAGE_SIZE:
            del fields["limit"]
        names = {"date_from": "from", "date_to": "to"}
        return "/dashboard?" + urlencode({names.get(k, k): v for k, v in fields.items() if v})

    @property
    def filtered(self) -> bool:
        return any(v for k, v in asdict(self).items() if k not in ("after", "limit"))


def _day(text: str, name: str) -> int | None:
    if not text:
        return None
    try:
        return int(datetime.strptime(text, "%Y-%m-%d").replace(tzinfo=UTC).timestamp())
    except ValueError:
        raise OpenAIError(f"'{name}' must be a date as YYYY-MM-DD.", param=name) from None


def batch_rows(session: Session, storage: Storage, query: BatchQuery) -> dict[str, Any]:
    """A page of the list, the link to the next one, and what a custom_id search covered."""
    now = time.time()
    note = ""
    if query.custom_id:
        found = find_custom_id(session, storage, query.where(), query.custom_id, limit=query.limit)
        found_views, next_after = found.views, found.next_after
        note = f"Searched {human_bytes(found.scanned_bytes)} of input files for this custom_id"
        note += ", newest first; older batches follow on the next page." if next_after else "."
    else:
        page = monitoring.list_batches(session, query.where(), limit=query.limit)
        found_views, next_after = page.views, page.next_after
    return {
        "rows": [batch_views.batch_row(v, now) for v in found_views],
        "next_href": query.href(next_after) if next_after else "",
        "search_note": note,
    }


def project_options(session: Session) -> list[tuple[str, str]]:
    return [(p.id, p.name) for p in monitoring.list_projects(session)]


def file_rows(session: Session, project: str, purpose: str) -> list[Row]:
    found = monitoring.list_files(session, project_id=project or None, purpose=purpose or None)
    return [project_views.file_row(f, name) for f, name in found]


def worker_rows(session: Session, lease: float) -> list[Row]:
    return [worker_views.worker_row(w) for w in monitoring.list_workers(session, lease)]


def workers_page(session: Session, lease: float) -> dict[str, list[Row]]:
    """The workers, and each project's use of their online APIs by model, as of one moment."""
    online = [worker_views.online_row(row) for row in online_usage.totals(session)]
    return {"rows": worker_rows(session, lease), "online": online}


def worker_detail(session: Session, worker_id: str, lease: float) -> Row:
    view = monitoring.get_worker(session, worker_id, lease)
    if view is None:
        raise not_found("Worker", worker_id)
    return worker_views.worker_detail(
        view, monitoring.recent_shards(session, worker_id), time.time()
    )


def webhook_rows(session: Session) -> list[Row]:
    return [
        project_views.webhook_row(*found) for found in webhook_endpoints.every_endpoint(session)
    ]


def webhooks_page(session: Session) -> dict[str, Any]:
    return {"rows": webhook_rows(session), "projects": monitoring.list_projects(session)}


def key_rows(session: Session) -> list[Row]:
    return [project_views.key_row(key) for key in keys.key_objects(session)]


def batch_detail(session: Session, batch_id: str) -> Row:
    view = monitoring.get_batch(session, batch_id)
    if view is None:
        raise not_found("Batch", batch_id)
    b = view.batch
    files = monitoring.files_by_id(session, [b.input_file_id, b.output_file_id, b.error_file_id])
    plan = schedule.schedule_of(session, batch_id)
    detail = batch_views.batch_detail(view, plan, files, time.time())
    series = b.throughput or throughput_series(session, batch_id)
    detail["series"] = series = [(t, rate) for t, rate in series]
    detail["chart_caption"] = charts.chart_caption(series, view.batch.status)
    detail.update(charts.chart_axes(series))
    return detail


def batches_page(session: Session, storage: Storage, query: BatchQuery) -> dict[str, Any]:
    return {**batch_rows(session, storage, query), "project_options": project_options(session)}


def overview(session: Session, stats: Stats) -> dict[str, Any]:
    now = stats.taken_at
    found = worker_views.fleet_overview(stats.fleet)
    series = deployment_series(session, now - OVERVIEW_WINDOW_SECONDS, now)
    found["series"] = series
    found.update(charts.chart_axes(series, clock="%H:%M"))
    return found


def _owner_of(session: Session, file_id: str) -> str:
    """The project of any file the dashboard names, or a 404."""
    owner = monitoring.file_owner(session, file_id)
    if owner is None:
        raise not_found("File", file_id)
    return owner


def file_preview(session: Session, storage: Storage, file_id: str) -> Row:
    owner = _owner_of(session, file_id)
    return project_views.preview(preview_file(session, storage, owner, file_id))


def delete_any_file(session: Session, file_id: str) -> str:
    """Deletes a file of any project (the dashboard is an admin's), as the API's DELETE does."""
    return file_expiry.delete_file(session, _owner_of(session, file_id), file_id).id


def files_page(session: Session, project: str, purpose: str) -> dict[str, Any]:
    return {
        "rows": file_rows(session, project, purpose),
        "project_options": project_options(session),
    }


def keys_page(session: Session, settings: Settings) -> dict[str, Any]:
    limits: dict[str, list[str]] = {}
    for found in enqueued.overridden(session, settings):
        limits.setdefault(found.project_id, []).append(project_views.limits_line(found))
    projects = monitoring.list_projects(session)
    held = quotas.quota_objects(session, settings, projects)
    return {
        "rows": key_rows(session),
        "projects": projects,
        "limits": limits,
        "quotas": {found.project_id: project_views.quota_lines(found) for found in held},
        "models": [m.name for m in settings.models],
    }


def open_any_file(
    session: Session, storage: Storage, file_id: str
) -> tuple[str, int, Iterator[bytes]]:
    row, chunks = open_file_content(session, storage, _owner_of(session, file_id), file_id)
    return row.filename, row.bytes, chunks
