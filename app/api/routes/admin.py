"""Admin endpoints: projects' API keys and the worker fleet (admin key required)."""

from fastapi import APIRouter, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app.api.body import json_body_openapi, read_json
from app.api.deps import AdminDep, SessionDep, SettingsDep
from app.db.models import ApiKey, Project
from app.schemas.admin import (
    ApiKeyObject,
    ApiKeyRevoked,
    CreateApiKeyRequest,
    CreatedApiKey,
    ProjectObject,
    WorkerObject,
)
from app.schemas.common import ListObject
from app.services import keys, monitoring

router = APIRouter(prefix="/admin", tags=["admin"])


def key_object(key: ApiKey, project: Project) -> ApiKeyObject:
    return ApiKeyObject(
        id=key.id,
        name=key.name,
        project_id=project.id,
        project_name=project.name,
        role=key.role,
        redacted_value=key.redacted,
        created_at=key.created_at,
        revoked_at=key.revoked_at,
    )


def create_key_object(session: Session, body: CreateApiKeyRequest) -> tuple[ApiKeyObject, str]:
    """Creates and commits a key; returns it with its secret."""
    key, project, secret = keys.create_project_key(session, body.project, body.role, body.name)
    session.commit()
    return key_object(key, project), secret


@router.get("/projects", operation_id="listProjects")
def list_projects(_admin: AdminDep, session: SessionDep) -> ListObject[ProjectObject]:
    projects = [
        ProjectObject(id=p.id, name=p.name, created_at=p.created_at)
        for p in monitoring.list_projects(session)
    ]
    return ListObject.of(projects, has_more=False)


@router.get("/api_keys", operation_id="listApiKeys")
def list_api_keys(
    _admin: AdminDep,
    session: SessionDep,
    project: str | None = None,
    include_revoked: bool = False,
) -> ListObject[ApiKeyObject]:
    """Every project's keys (or one project's, by name); secrets are never shown."""
    rows = keys.list_keys(session, project, include_revoked)
    return ListObject.of([key_object(k, p) for k, p in rows], has_more=False)


@router.post(
    "/api_keys",
    operation_id="createApiKey",
    openapi_extra=json_body_openapi(CreateApiKeyRequest),
)
async def create_api_key(request: Request, _admin: AdminDep, session: SessionDep) -> CreatedApiKey:
    """Create a key for a project (created if new). The response holds the secret, once."""
    body = await read_json(request, CreateApiKeyRequest)
    key, secret = await run_in_threadpool(create_key_object, session, body)
    return CreatedApiKey(**key.model_dump(), value=secret)


@router.delete("/api_keys/{key_id}", operation_id="revokeApiKey")
def revoke_api_key(
    key_id: str, _admin: AdminDep, session: SessionDep, settings: SettingsDep
) -> ApiKeyRevoked:
    """Revoke a key at once; the last admin key is kept (409) unless OVERNIGHT_ADMIN_KEY is set."""
    key = keys.revoke_key(session, key_id, admin_key_configured=bool(settings.admin_key))
    session.commit()
    return ApiKeyRevoked(id=key.id)


@router.get("/workers", operation_id="listWorkers")
def list_workers(
    _admin: AdminDep, session: SessionDep, settings: SettingsDep
) -> ListObject[WorkerObject]:
    """Workers live first; `state` is running, idle, stale (no heartbeat) or stopped."""
    views = monitoring.list_workers(session, settings.lease_seconds)
    session.rollback()
    data = [
        WorkerObject(
            id=v.worker.id,
            host=v.worker.host,
            pid=v.worker.pid,
            model=v.worker.model,
            state=v.state,
            started_at=v.worker.started_at,
            heartbeat_at=v.worker.heartbeat_at,
            heartbeat_age_seconds=round(v.heartbeat_age, 3),
            current_batch_id=v.batch_id,
            current_shard_index=v.shard_index,
            tokens_per_second=v.worker.tokens_per_second,
            stopped_at=v.worker.stopped_at,
        )
        for v in views
    ]
    return ListObject.of(data, has_more=False)
