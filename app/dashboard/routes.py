"""The admin dashboard: server-rendered pages, JSON feeds for live updates, and actions.

Every read and write goes through a service in a `uow.run` (one committed transaction).
"""

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Form, Query, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from pydantic import field_validator

from app.api.body import read_json
from app.api.deps import AccessDep, PrincipalCacheDep, SettingsDep, StorageDep, UnitOfWorkDep
from app.api.retry import run_retry
from app.api.unit_of_work import UnitOfWork
from app.core.states import BatchStatus, WebhookEventType
from app.dashboard import content, views
from app.dashboard.auth import (
    COOKIE,
    COOKIE_PATH,
    ApiLogin,
    PageLogin,
    is_admin_key,
    safe_next,
)
from app.errors import OpenAIError
from app.schemas.admin import (
    CreateApiKeyRequest,
    UpdateEnqueuedLimitsRequest,
    UpdateProjectQuotasRequest,
    UpdateProjectRequest,
)
from app.schemas.webhooks import CreateWebhookEndpointRequest, UpdateWebhookEndpointRequest
from app.services import (
    batches,
    enqueued,
    file_expiry,
    keys,
    quotas,
    schedule,
    webhook_delivery,
    webhook_endpoints,
)
from app.services.auth import Principal
from app.services.housekeeping import FINALIZATION, wake
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
    _set_login_cookie(response, request, key)
    return response


def _set_login_cookie(response: Response, request: Request, key: str) -> None:
    response.set_cookie(
        COOKIE,
        key,
        httponly=True,
        samesite="strict",
        # The original request's: uvicorn takes X-Forwarded-Proto from trusted proxies
        # (OVERNIGHT_FORWARDED_ALLOW_IPS).
        secure=request.url.scheme == "https",
        path=COOKIE_PATH,
    )


@router.post("/logout")
def logout() -> Response:
    response = RedirectResponse(f"{COOKIE_PATH}/login", status_code=303)
    response.delete_cookie(COOKIE, path=COOKIE_PATH)
    return response


# --- pages ------------------------------------------------------------------------------


def batch_query(
    status: str = "",
    project: str = "",
    q: str = "",
    custom_id: str = "",
    date_from: Annotated[str, Query(alias="from")] = "",
    date_to: Annotated[str, Query(alias="to")] = "",
    after: str = "",
    limit: Annotated[int, Query(ge=1, le=content.PAGE_SIZE)] = content.PAGE_SIZE,
) -> content.BatchQuery:
    """The batch list's query string; `after` and `limit` as in the API's list."""
    return content.BatchQuery(
        status, project, q, custom_id.strip(), date_from, date_to, after, limit
    )


BatchQueryDep = Annotated[content.BatchQuery, Depends(batch_query)]


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
    request: Request, _login: PageLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> Response:
    found = await uow.run(content.overview, settings.lease_seconds)
    return await _page(request, uow, "overview.html", overview=found)


@router.get("/batches/{batch_id}", response_class=HTMLResponse)
async def batch_page(
    request: Request, batch_id: str, _login: PageLogin, uow: UnitOfWorkDep, settings: SettingsDep
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
        request, uow, "webhooks.html", **await uow.run(content.webhooks_page), events=ALL_EVENTS
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


# --- JSON feeds and actions (the page script) --------------------------------------------


@router.get("/api/batches")
async def batches_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, storage: StorageDep, query: BatchQueryDep
) -> dict[str, Any]:
    return await uow.run(content.batch_rows, storage, query)


@router.get("/api/overview")
async def overview_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    return await uow.run(content.overview, settings.lease_seconds)


@router.get("/api/batches/{batch_id}")
async def batch_feed(
    batch_id: str, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    return await uow.run(content.batch_detail, batch_id)


@router.post("/api/batches/{batch_id}/cancel")
async def cancel(
    batch_id: str, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, str]:
    batch = await uow.run(batches.cancel_any_batch, batch_id)
    wake(settings, FINALIZATION)  # with no worker holding a shard, it ends `cancelled` at once
    return {"id": batch.id, "status": batch.status}


@router.post("/api/batches/{batch_id}/retry")
async def retry(
    batch_id: str,
    _login: ApiLogin,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> dict[str, str]:
    """A new batch of the failures a retry can change; the page goes to it."""
    batch = await run_retry(uow, settings, storage, None, batch_id, include_all=False)
    return {"id": batch.id, "href": f"{COOKIE_PATH}/batches/{batch.id}"}


@router.get("/api/workers")
async def workers_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    return {"rows": await uow.run(content.worker_rows, settings.lease_seconds)}


@router.get("/api/workers/{worker_id}")
async def worker_feed(
    worker_id: str, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    return await uow.run(content.worker_detail, worker_id, settings.lease_seconds)


@router.get("/api/files")
async def files_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, project: str = "", purpose: str = ""
) -> dict[str, Any]:
    return {"rows": await uow.run(content.file_rows, project, purpose)}


@router.get("/api/files/{file_id}/preview")
async def file_preview(
    file_id: str, _login: ApiLogin, uow: UnitOfWorkDep, storage: StorageDep
) -> dict[str, Any]:
    return await uow.run(content.file_preview, storage, file_id)


@router.post("/api/files/{file_id}/delete")
async def delete_file(
    file_id: str, _login: ApiLogin, uow: UnitOfWorkDep, storage: StorageDep
) -> dict[str, Any]:
    deleted = await uow.run(content.delete_any_file, file_id)
    await uow.run(file_expiry.reclaim_deleted, storage, file_id)
    return {"id": deleted, "deleted": True}


@router.get("/api/keys")
async def keys_feed(_login: ApiLogin, uow: UnitOfWorkDep) -> dict[str, Any]:
    return {"rows": await uow.run(content.key_rows)}


@router.post("/api/keys")
async def create_key(request: Request, _login: ApiLogin, uow: UnitOfWorkDep) -> Response:
    body = await read_json(request, CreateApiKeyRequest)
    key, secret = await uow.run(keys.create_key_object, body.project, body.role, body.name)
    response = JSONResponse({"row": views.key_row(key), "value": secret})
    if body.role == "admin" and not request.cookies.get(COOKIE):
        # The first key ends open mode: keep this browser logged in with it.
        _set_login_cookie(response, request, secret)
    return response


@router.post("/api/projects/{project_id}/weight")
async def set_weight(
    project_id: str, request: Request, _login: ApiLogin, uow: UnitOfWorkDep
) -> dict[str, Any]:
    body = await read_json(request, UpdateProjectRequest)
    project = await uow.run(schedule.set_weight, project_id, body.weight)
    return {"id": project.id, "weight": project.weight}


class LimitsForm(UpdateEnqueuedLimitsRequest):
    """The projects table's limits form: a blank field is the deployment's default."""

    @field_validator("token_limit", "request_limit", mode="before")
    @classmethod
    def _blank_is_default(cls, value: object) -> object:
        return None if value == "" else value


@router.post("/api/projects/{project_id}/limits")
async def set_limits(
    project_id: str,
    request: Request,
    _login: ApiLogin,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    body = await read_json(request, LimitsForm)
    found = await uow.run(enqueued.set_limits, settings, project_id, body)
    return {"id": found.project_id, "limits": views.limits_line(found)}


class QuotasForm(UpdateProjectQuotasRequest):
    """The projects table's quotas form: a blank field is the deployment's default."""

    @field_validator(*UpdateProjectQuotasRequest.model_fields, mode="before")
    @classmethod
    def _blank_is_default(cls, value: object) -> object:
        return None if value == "" else value


@router.post("/api/projects/{project_id}/quotas")
async def set_quotas(
    project_id: str,
    request: Request,
    _login: ApiLogin,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    body = await read_json(request, QuotasForm)
    found = await uow.run(quotas.set_quotas, settings, project_id, body)
    return {"id": found.project_id, "quotas": views.quota_lines(found)}


@router.post("/api/keys/{key_id}/revoke")
async def revoke_key(
    key_id: str,
    _login: ApiLogin,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    principals: PrincipalCacheDep,
) -> dict[str, str]:
    key = await uow.run(keys.revoke_key, key_id, admin_key_configured=bool(settings.admin_key))
    principals.clear()  # refused by this process from the next request on
    return {"id": key.id}


# --- webhook endpoints: any project's, as an admin key manages them through the API ----------

ALL_EVENTS = [str(event) for event in WebhookEventType]
# The dashboard acts as an admin; its project is only used when a form names none.
DASHBOARD_ADMIN = Principal(project_id="", role="admin")


@router.get("/api/webhooks")
async def webhooks_feed(_login: ApiLogin, uow: UnitOfWorkDep) -> dict[str, Any]:
    return {"rows": await uow.run(content.webhook_rows)}


@router.post("/api/webhooks")
async def create_webhook(
    request: Request, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    """The signing secret is in the answer, once."""
    params = await read_json(request, CreateWebhookEndpointRequest)
    if not params.project:
        raise OpenAIError("Choose the project the endpoint is for.", param="project")
    created = await uow.run(webhook_endpoints.create_endpoint, settings, DASHBOARD_ADMIN, params)
    return {"id": created.id, "secret": created.signing_secret}


@router.post("/api/webhooks/{endpoint_id}")
async def update_webhook(
    endpoint_id: str, request: Request, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, str]:
    params = await read_json(request, UpdateWebhookEndpointRequest)
    await uow.run(webhook_endpoints.update_endpoint, settings, None, endpoint_id, params)
    return {"id": endpoint_id}


@router.post("/api/webhooks/{endpoint_id}/{change}")
async def change_webhook(
    endpoint_id: str,
    change: str,
    _login: ApiLogin,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    """enable, disable, delete, rotate (the new secret, once) or test (a sample event now)."""
    if change in ("enable", "disable"):
        enabled = UpdateWebhookEndpointRequest.model_validate({"enabled": change == "enable"})
        await uow.run(webhook_endpoints.update_endpoint, settings, None, endpoint_id, enabled)
        return {"id": endpoint_id}
    if change == "delete":
        return {"id": await uow.run(webhook_endpoints.delete_endpoint, None, endpoint_id)}
    if change == "rotate":
        rotated = await uow.run(webhook_endpoints.rotate_secret, None, endpoint_id, False)
        return {"id": endpoint_id, "secret": rotated.signing_secret}
    if change == "test":
        test = await uow.run(
            webhook_delivery.prepare_test, None, endpoint_id, WebhookEventType.BATCH_COMPLETED
        )
        attempt = await webhook_delivery.send_test(settings, test)
        await uow.run(webhook_delivery.record_test, test, attempt)
        outcome = f"HTTP {attempt.status_code}" if attempt.status_code else attempt.error
        return {"id": endpoint_id, "message": f"Test event sent: {outcome}."}
    raise OpenAIError(f"Unknown action {change!r}.", status_code=404)
