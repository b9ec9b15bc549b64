"""Administering projects' API keys: list, create, revoke."""

import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.models import ApiKey, Project
from app.errors import OpenAIError, not_found
from app.schemas.admin import ApiKeyObject
from app.services.auth import create_key


def list_keys(
    session: Session, project_name: str | None = None, include_revoked: bool = False
) -> list[tuple[ApiKey, Project]]:
    """Keys with their projects, newest first."""
    query = select(ApiKey, Project).join(Project, Project.id == ApiKey.project_id)
    if project_name:
        query = query.where(Project.name == project_name)
    if not include_revoked:
        query = query.where(ApiKey.revoked_at.is_(None))
    return [(k, p) for k, p in session.execute(query.order_by(ApiKey.seq.desc()))]


def to_key_object(key: ApiKey, project: Project) -> ApiKeyObject:
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


def key_objects(
    session: Session, project_name: str | None = None, include_revoked: bool = False
) -> list[ApiKeyObject]:
    return [to_key_object(k, p) for k, p in list_keys(session, project_name, include_revoked)]


def create_key_object(
    session: Session, project_name: str, role: str = "member", name: str = ""
) -> tuple[ApiKeyObject, str]:
    """A new key as the API shows it, with its secret (shown this once)."""
    key, project, secret = create_project_key(session, project_name, role, name)
    return to_key_object(key, project), secret


def create_project_key(
    session: Session, project_name: str, role: str = "member", name: str = ""
) -> tuple[ApiKey, Project, str]:
    """A new key (and its project if new); the secret is returned once."""
    project_name = project_name.strip()
    if not project_name:
        raise OpenAIError("A project name is required.", param="project")
    key, secret = create_key(session, project_name, role=role, name=name)
    project = session.scalars(select(Project).where(Project.id == key.project_id)).one()
    return key, project, secret


def revoke_key(session: Session, key_id: str, *, admin_key_configured: bool) -> ApiKey:
    """Revoke a key at once; revoking a revoked key changes nothing.

    The last admin key is kept unless `OVERNIGHT_ADMIN_KEY` is set: without it nobody
    could manage keys over the API any more, and a restart would open the API.
    """
    key = session.scalar(select(ApiKey).where(ApiKey.id == key_id))
    if key is None:
        raise not_found("API key", key_id)
    if key.revoked_at is not None:
        return key
    if key.role == "admin" and not admin_key_configured:
        # Locks the admin keys (PostgreSQL) so that two revokes cannot each leave the other.
        admins = session.scalars(
            select(ApiKey.id)
            .where(ApiKey.role == "admin", ApiKey.revoked_at.is_(None))
            .with_for_update()
        ).all()
        if admins == [key.id]:
            raise OpenAIError(
                f"{key.id} is the last admin key: revoking it would leave nobody able to "
                "manage keys. Create another admin key first (on the server's machine, "
                "`overnight keys create --role admin` works on its database "
                "directly), or set OVERNIGHT_ADMIN_KEY.",
                status_code=409,
                code="last_admin_key",
            )
    key.revoked_at = int(time.time())
    return key
