"""The dashboard's JSON feeds (live updates) and actions, for the pages' script.

Every read and write goes through a service in a `uow.run` (one committed transaction).
"""

from collections.abc import Callable
from typing import Any, Literal, NamedTuple

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy.orm import Session

from app.api.body import read_json
from app.api.deps import PrincipalCacheDep, SettingsDep, StatsDep, StorageDep, UnitOfWorkDep
from app.api.retry import run_retry
from app.config import Settings
from app.core.states import WebhookEventType
from app.dashboard import content, project_views
from app.dashboard.auth import COOKIE, COOKIE_PATH, ApiLogin, set_login_cookie
from app.dashboard.forms import BatchQueryDep, LimitsForm, QuotasForm
from app.errors import OpenAIError
from app.schemas.admin import CreateApiKeyRequest, UpdateProjectRequest
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

router = APIRouter(prefix=f"{COOKIE_PATH}/api", include_in_schema=False)


@router.get("/batches")
async def batches_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, storage: StorageDep, query: BatchQueryDep
) -> dict[str, Any]:
    return await uow.run(content.batch_rows, storage, query)


@router.get("/overview")
async def overview_feed(_login: ApiLogin, uow: UnitOfWorkDep, stats: StatsDep) -> dict[str, Any]:
    return await uow.run(content.overview, stats)


@router.get("/batches/{batch_id}")
async def batch_feed(batch_id: str, _login: ApiLogin, uow: UnitOfWorkDep) -> dict[str, Any]:
    return await uow.run(content.batch_detail, batch_id)


@router.post("/batches/{batch_id}/cancel")
async def cancel(
    batch_id: str, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, str]:
    batch = await uow.run(batches.cancel_any_batch, batch_id)
    wake(settings, FINALIZATION)  # with no worker holding a shard, it ends `cancelled` at once
    return {"id": batch.id, "status": batch.status}


@router.post("/batches/{batch_id}/retry")
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


@router.get("/workers")
async def workers_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    return {"rows": await uow.run(content.worker_rows, settings.lease_seconds)}


@router.get("/workers/{worker_id}")
async def worker_feed(
    worker_id: str, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    return await uow.run(content.worker_detail, worker_id, settings.lease_seconds)


@router.get("/files")
async def files_feed(
    _login: ApiLogin, uow: UnitOfWorkDep, project: str = "", purpose: str = ""
) -> dict[str, Any]:
    return {"rows": await uow.run(content.file_rows, project, purpose)}


@router.get("/files/{file_id}/preview")
async def file_preview(
    file_id: str, _login: ApiLogin, uow: UnitOfWorkDep, storage: StorageDep
) -> dict[str, Any]:
    return await uow.run(content.file_preview, storage, file_id)


@router.post("/files/{file_id}/delete")
async def delete_file(
    file_id: str, _login: ApiLogin, uow: UnitOfWorkDep, storage: StorageDep
) -> dict[str, Any]:
    deleted = await uow.run(content.delete_any_file, file_id)
    await uow.run(file_expiry.reclaim_deleted, storage, file_id)
    return {"id": deleted, "deleted": True}


@router.get("/keys")
async def keys_feed(_login: ApiLogin, uow: UnitOfWorkDep) -> dict[str, Any]:
    return {"rows": await uow.run(content.key_rows)}


@router.post("/keys")
async def create_key(request: Request, _login: ApiLogin, uow: UnitOfWorkDep) -> Response:
    body = await read_json(request, CreateApiKeyRequest)
    key, secret = await uow.run(keys.create_key_object, body.project, body.role, body.name)
    response = JSONResponse({"row": project_views.key_row(key), "value": secret})
    if body.role == "admin" and not request.cookies.get(COOKIE):
        # The first key ends open mode: keep this browser logged in with it.
        set_login_cookie(response, request, secret)
    return response


@router.post("/projects/{project_id}/weight")
async def set_weight(
    project_id: str, request: Request, _login: ApiLogin, uow: UnitOfWorkDep
) -> dict[str, Any]:
    body = await read_json(request, UpdateProjectRequest)
    project = await uow.run(schedule.set_weight, project_id, body.weight)
    return {"id": project.id, "weight": project.weight}


class _ProjectSetting(NamedTuple):
    form: type[BaseModel]
    apply: Callable[[Session, Settings, str, Any], Any]
    show: Callable[[Any], str | list[str]]


# The projects table's forms beside the weight: each sets what it carries, then shows it.
_PROJECT_SETTINGS = {
    "limits": _ProjectSetting(LimitsForm, enqueued.set_limits, project_views.limits_line),
    "quotas": _ProjectSetting(QuotasForm, quotas.set_quotas, project_views.quota_lines),
}


@router.post("/projects/{project_id}/{setting}")
async def set_project_setting(
    project_id: str,
    setting: Literal["limits", "quotas"],
    request: Request,
    _login: ApiLogin,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
) -> dict[str, Any]:
    form, apply, show = _PROJECT_SETTINGS[setting]
    body = await read_json(request, form)
    found = await uow.run(apply, settings, project_id, body)
    return {"id": found.project_id, setting: show(found)}


@router.post("/keys/{key_id}/revoke")
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

# The dashboard acts as an admin; its project is only used when a form names none.
DASHBOARD_ADMIN = Principal(project_id="", role="admin")


@router.get("/webhooks")
async def webhooks_feed(_login: ApiLogin, uow: UnitOfWorkDep) -> dict[str, Any]:
    return {"rows": await uow.run(content.webhook_rows)}


@router.post("/webhooks")
async def create_webhook(
    request: Request, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, Any]:
    """The signing secret is in the answer, once."""
    params = await read_json(request, CreateWebhookEndpointRequest)
    if not params.project:
        raise OpenAIError("Choose the project the endpoint is for.", param="project")
    created = await uow.run(webhook_endpoints.create_endpoint, settings, DASHBOARD_ADMIN, params)
    return {"id": created.id, "secret": created.signing_secret}


@router.post("/webhooks/{endpoint_id}")
async def update_webhook(
    endpoint_id: str, request: Request, _login: ApiLogin, uow: UnitOfWorkDep, settings: SettingsDep
) -> dict[str, str]:
    params = await read_json(request, UpdateWebhookEndpointRequest)
    await uow.run(webhook_endpoints.update_endpoint, settings, None, endpoint_id, params)
    return {"id": endpoint_id}


@router.post("/webhooks/{endpoint_id}/{change}")
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
