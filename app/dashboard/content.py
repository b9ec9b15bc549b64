"""What each dashboard page and feed shows, read through the services in one transaction."""

import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy.orm import Session

from app.dashboard import views
from app.errors import not_found
from app.services import keys, monitoring, webhook_endpoints
from app.services.files import open_file_content
from app.services.throughput import throughput_series
from app.storage import Storage


def batch_rows(session: Session, status: str | None, project: str | None) -> list[views.Row]:
    now = time.time()
    found = monitoring.list_batches(session, status=status or None, project_id=project or None)
    return [views.batch_row(v, now) for v in found]


def project_options(session: Session) -> list[tuple[str, str]]:
    return [(p.id, p.name) for p in monitoring.list_projects(session)]


def file_rows(session: Session, project: str, purpose: str) -> list[views.Row]:
    found = monitoring.list_files(session, project_id=project or None, purpose=purpose or None)
    return [views.file_row(f, name) for f, name in found]


def worker_rows(session: Session, lease: float) -> list[views.Row]:
    return [views.worker_row(w) for w in monitoring.list_workers(session, lease)]


def worker_detail(session: Session, worker_id: str, lease: float) -> views.Row:
    view = monitoring.get_worker(session, worker_id, lease)
    if view is None:
        raise not_found("Worker", worker_id)
    return views.worker_detail(view, monitoring.recent_shards(session, worker_id), time.time())


def webhook_rows(session: Session) -> list[views.Row]:
    return [views.webhook_row(*found) for found in webhook_endpoints.every_endpoint(session)]


def webhooks_page(session: Session) -> dict[str, Any]:
    return {"rows": webhook_rows(session), "projects": monitoring.list_projects(session)}


def key_rows(session: Session) -> list[views.Row]:
    return [views.key_row(key) for key in keys.key_objects(session)]


def batch_detail(session: Session, batch_id: str) -> views.Row:
    view = monitoring.get_batch(session, batch_id)
    if view is None:
        raise not_found("Batch", batch_id)
    b = view.batch
    files = monitoring.files_by_id(session, [b.input_file_id, b.output_file_id, b.error_file_id])
    detail = views.batch_detail(view, files, time.time())
    series = b.throughput or throughput_series(session, batch_id)
    detail["series"] = series = [(t, rate) for t, rate in series]
    detail["chart_caption"] = views.chart_caption(series, view.batch.status)
    return detail


def batches_page(session: Session, status: str, project: str) -> dict[str, Any]:
    return {
        "rows": batch_rows(session, status, project),
        "project_options": project_options(session),
    }


def files_page(session: Session, project: str, purpose: str) -> dict[str, Any]:
    return {
        "rows": file_rows(session, project, purpose),
        "project_options": project_options(session),
    }


def keys_page(session: Session) -> dict[str, Any]:
    return {"rows": key_rows(session), "projects": monitoring.list_projects(session)}


def open_any_file(
    session: Session, storage: Storage, file_id: str
) -> tuple[str, int, Iterator[bytes]]:
    owner = monitoring.file_owner(session, file_id)
    if owner is None:
        raise not_found("File", file_id)
    row, chunks = open_file_content(session, storage, owner, file_id)
    return row.filename, row.bytes, chunks
