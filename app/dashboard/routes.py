"""The admin dashboard's server-rendered pages and its login (`feeds` serves their live data).

Every read and write goes through a service in a `uow.run` (one committed transaction).
"""

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Form, Request
from fastapi.responses import (
    HTMLResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader

from app.api.deps import AccessDep, SettingsDep, StatsDep, StorageDep, UnitOfWorkDep
from app.api.unit_of_work import UnitOfWork
from app.core.states import ALL_WEBHOOK_EVENTS, BatchStatus
from app.dashboard import content
from app.dashboard.auth import (
    COOKIE,
    COOKIE_PATH,
    PageLogin,
    is_admin_key,
    safe_next,
    set_login_cookie,
)
from app.dashboard.forms import BatchQueryDep
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


async def _page(request: Request, uow: UnitOfWork, name: str, **context: Any) -> HTMLResponse:
    state = request.app.state
    open_mode = await uow.run(state.access.recheck_open, state.settings)
    return templates.TemplateResponse(
        request,
        name,
        {"open_mode": open_mode, "page": name.removesuffix(".html"), **context},
        headers=SECURITY_HEADERS,
    )


# --- login ------------------------------------------------------------------------------


@router.get("/login")
async def login_form(request: Request, uow: UnitOfWorkDep, next: str | None = None) -> Response:
    return await _page(request, uow, "login.html", next=safe_next(next), error=None)


@router.post("/login")
async def login(
    request: Request,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    access: AccessDep,
    key: Annotated[str, Form()] = "",
    next: Annotated[str, Form()] = COOKIE_PATH,
) -> Response:
    key = key.strip()
    if not key or not await uow.run(is_admin_key, settings, access, key):
        refused = await _page(
            request, uow, "login.html", next=safe_next(next), error="That is not an admin key."
        )
        refused.status_code = 401
        return refused
    response = RedirectResponse(safe_next(next), status_code=303)
    set_login_cookie(response, request, key)
    return response


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse(f"{COOKIE_PATH}/login", status_code=303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH)
    return response


# --- pages ------------------------------------------------------------------------------


@router.get("", response_class=HTMLResponse)
async def batches_page(
    request: Request,
    _login: PageLogin,
    uow: UnitOfWorkDep,
    storage: StorageDep,
    query: BatchQueryDep,
) -> Response:
    found = await uow.run(content.batches_page, storage, query)
    return await _page(
        request,
        uow,
        "batches.html",
        **found,
        status_options=[(s.value, s.value) for s in BatchStatus],
        query=query,
    )


@router.get("/overview", response_class=HTMLResponse)
async def overview_page(
    request: Request, _login: PageLogin, uow: UnitOfWorkDep, stats: StatsDep
) -> Response:
    found = await uow.run(content.overview, stats)
    return await _page(request, uow, "overview.html", overview=found)


@router.get("/batches/{batch_id}", response_class=HTMLResponse)
async def batch_page(
    request: Request, batch_id: str, _login: PageLogin, uow: UnitOfWorkDep
) -> Response:
    batch = await uow.run(content.batch_detail, batch_id)
    return await _page(request, uow, "batch.html", batch=batch)


@router.get("/files", response_class=HTMLResponse)
async def files_page(
    request: Request,
    _login: PageLogin,
    uow: UnitOfWorkDep,
    project: str = "",
    purpose: str = "",
) -> Response:
    found = await uow.run(content.files_page, project, purpose)
    return await _page(
        request,
        uow,
        "files.html",
        **found,
        purpose_options=[(p, p) for p in FILE_PURPOSES],
        project=project,
        purpose=purpose,
    )


@router.get("/workers", response_class=HTMLResponse)
async def workers_page(
    request: Request, _login: PageLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> Response:
    found = await uow.run(content.workers_page, settings.lease_seconds)
    return await _page(request, uow, "workers.html", **found)


@router.get("/workers/{worker_id}", response_class=HTMLResponse)
async def worker_page(
    request: Request, worker_id: str, _login: PageLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> Response:
    worker = await uow.run(content.worker_detail, worker_id, settings.lease_seconds)
    return await _page(request, uow, "worker.html", worker=worker)


@router.get("/webhooks", response_class=HTMLResponse)
async def webhooks_page(request: Request, _login: PageLogin, uow: UnitOfWorkDep) -> Response:
    return await _page(
        request,
        uow,
        "webhooks.html",
        **await uow.run(content.webhooks_page),
        events=ALL_WEBHOOK_EVENTS,
    )


@router.get("/keys", response_class=HTMLResponse)
async def keys_page(
    request: Request, _login: PageLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> Response:
    return await _page(request, uow, "keys.html", **await uow.run(content.keys_page, settings))


@router.get("/files/{file_id}/content")
async def download(
    file_id: str, _login: PageLogin, uow: UnitOfWorkDep, storage: StorageDep
) -> Response:
    """Any project's file, as an attachment under its own (quoted) name."""
    filename, size, chunks = await uow.run(content.open_any_file, storage, file_id)
    ascii_name = "".join(c if c.isalnum() or c in "._-" else "_" for c in filename)
    disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(filename)}"
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"content-disposition": disposition, "content-length": str(size)},
    )
