"""Admin endpoints: projects (their weights, enqueued limits and quotas), API keys, the
schedule, the worker fleet and the deployment's figures (admin key required).

Each `uow.run` is one committed transaction.
"""

from fastapi import APIRouter, Request

from app.api.body import json_post, read_json
from app.api.deps import AdminDep, PrincipalCacheDep, SettingsDep, StatsDep, UnitOfWorkDep
from app.schemas.admin import (
    ApiKeyObject,
    ApiKeyRevoked,
    CreateApiKeyRequest,
    CreatedApiKey,
    EnqueuedLimitsObject,
    ProjectObject,
    ProjectQuotasObject,
    ScheduledBatchObject,
    UpdateEnqueuedLimitsRequest,
    UpdateProjectQuotasRequest,
    UpdateProjectRequest,
    WorkerObject,
)
from app.schemas.common import ListObject
from app.schemas.stats import StatsObject
from app.services import enqueued, keys, monitoring, quotas, schedule
from app.services.stats import stats_object

router = APIRouter(prefix="/admin", tags=["admin"])


@router.get("/projects", operation_id="listProjects")
async def list_projects(_admin: AdminDep, uow: UnitOfWorkDep) -> ListObject[ProjectObject]:
    projects = await uow.run(monitoring.project_objects)
    return ListObject.of(projects, has_more=False)


@json_post(router, "/projects/{project}", UpdateProjectRequest, operation_id="modifyProject")
async def modify_project(
    project: str, request: Request, _admin: AdminDep, uow: UnitOfWorkDep
) -> ProjectObject:
    """Set a project's fair-share weight (the project by id or name)."""
    body = await read_json(request, UpdateProjectRequest)
    return await uow.run(schedule.set_weight, project, body.weight)


@router.get("/projects/{project}/limits", operation_id="listProjectLimits")
async def list_project_limits(
    project: str, _admin: AdminDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> ListObject[EnqueuedLimitsObject]:
    """A project's enqueued limits per model: its own where set, else the deployment's."""
    found = await uow.run(enqueued.limit_objects, settings, project)
    return ListObject.of(found, has_more=False)


@json_post(
    router,
    "/projects/{project}/limits",
    UpdateEnqueuedLimitsRequest,
    operation_id="modifyProjectLimits",
)
async def modify_project_limits(
    project: str, request: Request, _admin: AdminDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> EnqueuedLimitsObject:
    """Set a project's own enqueued token and request limits on a model (null: the default)."""
    body = await read_json(request, UpdateEnqueuedLimitsRequest)
    return await uow.run(enqueued.set_limits, settings, project, body)


@router.get("/projects/{project}/quotas", operation_id="retrieveProjectQuotas")
async def retrieve_project_quotas(
    project: str, _admin: AdminDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> ProjectQuotasObject:
    """A project's quotas (its own where set, else the deployment's) and what it holds."""
    return await uow.run(quotas.project_quotas, settings, project)


@json_post(
    router,
    "/projects/{project}/quotas",
    UpdateProjectQuotasRequest,
    operation_id="modifyProjectQuotas",
)
async def modify_project_quotas(
    project: str, request: Request, _admin: AdminDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> ProjectQuotasObject:
    """Set a project's own quotas: stored bytes, files, open uploads, unfinished batches (null:
    the deployment's)."""
    body = await read_json(request, UpdateProjectQuotasRequest)
    return await uow.run(quotas.set_quotas, settings, project, body)


@router.get("/schedule", operation_id="listSchedule")
async def list_schedule(_admin: AdminDep, uow: UnitOfWorkDep) -> ListObject[ScheduledBatchObject]:
    """Open batches in the order they are expected to be served, with their estimates."""
    return ListObject.of(await uow.run(schedule.schedule_objects), has_more=False)


@router.get("/stats", operation_id="retrieveStats")
async def retrieve_stats(_admin: AdminDep, stats: StatsDep) -> StatsObject:
    """Batches by status, work queued per model, workers by state, tokens today per project."""
    return stats_object(stats)


@router.get("/api_keys", operation_id="listApiKeys")
async def list_api_keys(
    _admin: AdminDep,
    uow: UnitOfWorkDep,
    project: str | None = None,
    include_revoked: bool = False,
) -> ListObject[ApiKeyObject]:
    """Every project's keys (or one project's, by name); secrets are never shown."""
    found = await uow.run(keys.key_objects, project, include_revoked)
    return ListObject.of(found, has_more=False)


@json_post(router, "/api_keys", CreateApiKeyRequest, operation_id="createApiKey")
async def create_api_key(request: Request, _admin: AdminDep, uow: UnitOfWorkDep) -> CreatedApiKey:
    """Create a key for a project (created if new). The response holds the secret, once."""
    body = await read_json(request, CreateApiKeyRequest)
    key, secret = await uow.run(keys.create_key_object, body.project, body.role, body.name)
    return CreatedApiKey(**key.model_dump(), value=secret)


@router.delete("/api_keys/{key_id}", operation_id="revokeApiKey")
async def revoke_api_key(
    key_id: str,
    _admin: AdminDep,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    principals: PrincipalCacheDep,
) -> ApiKeyRevoked:
    """Revoke a key at once; the last admin key is kept (409) unless OVERNIGHT_ADMIN_KEY is set."""
    key = await uow.run(keys.revoke_key, key_id, admin_key_configured=bool(settings.admin_key))
    principals.clear()  # refused by this process from the next request on
    return ApiKeyRevoked(id=key.id)


@router.get("/workers", operation_id="listWorkers")
async def list_workers(
    _admin: AdminDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> ListObject[WorkerObject]:
    """Workers live first; `state` is running, idle, stale (no heartbeat) or stopped."""
    views = await uow.run(monitoring.list_workers, settings.lease_seconds)
    return ListObject.of([v.wire() for v in views], has_more=False)
