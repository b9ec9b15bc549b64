"""The admin dashboard: server-rendered pages, JSON feeds for live updates, and actions."""

import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from sqlalchemy import select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.api.body import read_json
from app.api.deps import AccessDep, SessionDep, SettingsDep, StorageDep
from app.api.routes.admin import create_key_object, key_object
from app.core.states import BatchStatus
from app.dashboard import views
from app.dashboard.auth import (
    COOKIE,
    COOKIE_PATH,
    ApiLogin,
    PageLogin,
    is_admin_key,
    safe_next,
)
from app.db.models import Batch, File
from app.errors import not_found
from app.schemas.admin import CreateApiKeyRequest
from app.services import batches, keys, monitoring
from app.services.files import open_file_content
from app.services.housekeeping import FINALISATION, wake
from app.services.throughput import throughput_series
from app.version import overnight_version

HERE = Path(__file__).parent
templates = Jinja2Templates(
    env=Environment(loader=FileSystemLoader(HERE / "templates"), autoescape=True)
)
templates.env.globals["version"] = overnight_version()
# Defence in depth: even markup that slipped through could run no script.
SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
router = APIRouter(prefix=COOKIE_PATH, include_in_schema=False)
FILE_PURPOSES = ("batch", "batch_output", "fine-tune", "vision", "user_data", "assistants")


def _page(request: Request, session: Session, name: str, **context: Any) -> HTMLResponse:
    open_mode = request.app.state.access.is_open(session, request.app.state.settings)
    session.commit()
    return templates.TemplateResponse(
        request,
        name,
        {"open_mode": open_mode, "page": name.removesuffix(".html"), **context},
        headers=SECURITY_HEADERS,
    )


# --- login ------------------------------------------------------------------------------


@router.get("/login")
def login_form(request: Request, session: SessionDep, next: str | None = None) -> Response:
    return _page(request, session, "login.html", next=safe_next(next), error=None)


@router.post("/login")
def login(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    access: AccessDep,
    key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = COOKIE_PATH,
) -> Response:
    key = key.strip()
    if not key or not is_admin_key(session, settings, access, key):
        refused = _page(
            request, session, "login.html", next=safe_next(next), error="That is not an admin key."
        )
        refused.status_code = 401
        return refused
    response = RedirectResponse(safe_next(next), status_code=303)
    _set_login_cookie(response, request, key)
    return response


def _set_login_cookie(response: Response, request: Request, key: str) -> None:
    response.set_cookie(
        COOKIE,
        key,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path=COOKIE_PATH,
    )


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse(f"{COOKIE_PATH}/login", status_code=303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH)
    return response


# --- pages ------------------------------------------------------------------------------


def _batch_rows(
    session: Session, lease: float, status: str | None, project: str | None
) -> list[views.Row]:
    now = time.time()
    found = monitoring.list_batches(
        session, lease, status=status or None, project_id=project or None
    )
    return [views.batch_row(v, now) for v in found]


def _project_options(session: Session) -> list[tuple[str, str]]:
    return [(p.id, p.name) for p in monitoring.list_projects(session)]


def _file_rows(session: Session, project: str, purpose: str) -> list[views.Row]:
    found = monitoring.list_files(session, project_id=project or None, purpose=purpose or None)
    return [views.file_row(f, name) for f, name in found]


def _worker_rows(session: Session, lease: float) -> list[views.Row]:
    return [views.worker_row(w) for w in monitoring.list_workers(session, lease)]


def _key_rows(session: Session) -> list[views.Row]:
    return [views.key_row(key_object(k, p)) for k, p in keys.list_keys(session)]


@router.get("", response_class=HTMLResponse)
def batches_page(
    request: Request,
    _login: PageLogin,
    session: SessionDep,
    settings: SettingsDep,
    status: str = "",
    project: str = "",
) -> Response:
    rows = _batch_rows(session, settings.lease_seconds, status, project)
    return _page(
        request,
        session,
        "batches.html",
        rows=rows,
        status_options=[(s.value, s.value) for s in BatchStatus],
        project_options=_project_options(session),
        status=status,
        project=project,
    )


def _batch_detail(session: Session, batch_id: str, lease: float) -> views.Row:
    view = monitoring.get_batch(session, batch_id, lease)
    if view is None:
        raise not_found("Batch", batch_id)
    b = view.batch
    ids = [i for i in (b.input_file_id, b.output_file_id, b.error_file_id) if i]
    files = {f.id: f for f in session.scalars(select(File).where(File.id.in_(ids)))}
    detail = views.batch_detail(view, files, time.time())
    series = b.throughput or throughput_series(session, batch_id)
    detail["series"] = series = [(t, rate) for t, rate in series]
    detail["chart_caption"] = views.chart_caption(series, view.batch.status)
    return detail


@router.get("/batches/{batch_id}", response_class=HTMLResponse)
def batch_page(
    request: Request, batch_id: str, _login: PageLogin, session: SessionDep, settings: SettingsDep
) -> Response:
    batch = _batch_detail(session, batch_id, settings.lease_seconds)
    return _page(request, session, "batch.html", batch=batch)


@router.get("/files", response_class=HTMLResponse)
def files_page(
    request: Request,
    _login: PageLogin,
    session: SessionDep,
    project: str = "",
    purpose: str = "",
) -> Response:
    rows = _file_rows(session, project, purpose)
    return _page(
        request,
        session,
        "files.html",
        rows=rows,
        project_options=_project_options(session),
        purpose_options=[(p, p) for p in FILE_PURPOSES],
        project=project,
        purpose=purpose,
    )


@router.get("/workers", response_class=HTMLResponse)
def workers_page(
    request: Request, _login: PageLogin, session: SessionDep, settings: SettingsDep
) -> Response:
    rows = _worker_rows(session, settings.lease_seconds)
    return _page(request, session, "workers.html", rows=rows)


@router.get("/keys", response_class=HTMLResponse)
def keys_page(request: Request, _login: PageLogin, session: SessionDep) -> Response:
    rows = _key_rows(session)
    return _page(
        request, session, "keys.html", rows=rows, projects=monitoring.list_projects(session)
    )


@router.get("/files/{file_id}/content")
def download(file_id: str, _login: PageLogin, session: SessionDep, storage: StorageDep) -> Response:
    """Any project's file, as an attachment under its own (quoted) name."""
    owner = session.scalar(select(File.project_id).where(File.id == file_id))
    if owner is None:
        raise not_found("File", file_id)
    row, chunks = open_file_content(session, storage, owner, file_id)
    session.commit()
    ascii_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in row.filename)
    disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(row.filename)}"
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"content-disposition": disposition, "content-length": str(row.bytes)},
    )


# --- JSON feeds and actions (the page script) --------------------------------------------


@router.get("/api/batches")
def batches_feed(
    _login: ApiLogin,
    session: SessionDep,
    settings: SettingsDep,
    status: Annotated[str, Query()] = "",
    project: Annotated[str, Query()] = "",
) -> dict[str, Any]:
    rows = _batch_rows(session, settings.lease_seconds, status, project)
    session.commit()
    return {"rows": rows}


@router.get("/api/batches/{batch_id}")
def batch_feed(
    batch_id: str, _login: ApiLogin, session: SessionDep, settings: SettingsDep
) -> dict[str, Any]:
    detail = _batch_detail(session, batch_id, settings.lease_seconds)
    session.commit()
    return detail


@router.post("/api/batches/{batch_id}/cancel")
def cancel(
    batch_id: str, _login: ApiLogin, session: SessionDep, settings: SettingsDep
) -> dict[str, str]:
    project_id = session.scalar(select(Batch.project_id).where(Batch.id == batch_id))
    if project_id is None:
        raise not_found("Batch", batch_id)
    batch = batches.cancel_batch(session, project_id, batch_id)
    wake(settings, FINALISATION)  # with no worker holding a shard, it ends `cancelled` at once
    return {"id": batch.id, "status": batch.status}


@router.get("/api/workers")
def workers_feed(_login: ApiLogin, session: SessionDep, settings: SettingsDep) -> dict[str, Any]:
    rows = _worker_rows(session, settings.lease_seconds)
    session.commit()
    return {"rows": rows}


@router.get("/api/files")
def files_feed(
    _login: ApiLogin, session: SessionDep, project: str = "", purpose: str = ""
) -> dict[str, Any]:
    rows = _file_rows(session, project, purpose)
    session.commit()
    return {"rows": rows}


@router.get("/api/keys")
def keys_feed(_login: ApiLogin, session: SessionDep) -> dict[str, Any]:
    rows = _key_rows(session)
    session.commit()
    return {"rows": rows}


@router.post("/api/keys")
async def create_key(request: Request, _login: ApiLogin, session: SessionDep) -> Response:
    body = await read_json(request, CreateApiKeyRequest)
    key, secret = await run_in_threadpool(create_key_object, session, body)
    response = JSONResponse({"row": views.key_row(key), "value": secret})
    if body.role == "admin" and not request.cookies.get(COOKIE):
        # The first key ends open mode: keep this browser logged in with it.
        _set_login_cookie(response, request, secret)
    return response


@router.post("/api/keys/{key_id}/revoke")
def revoke_key(
    key_id: str, _login: ApiLogin, session: SessionDep, settings: SettingsDep
) -> dict[str, str]:
    key = keys.revoke_key(session, key_id, admin_key_configured=bool(settings.admin_key))
    session.commit()
    return {"id": key.id}
