"""A project's webhook endpoints: create, list, change, delete, rotate the secret.

`project_id` None is an admin's view: every project's endpoints. An admin names another
project with `project` (its name, as the keys API does); a member manages its own only.
"""

import time

from sqlalchemy import ColumnElement, bindparam, delete, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.webhook_signing import new_secret, secret_hint
from app.db.models import Project, WebhookDelivery, WebhookEndpoint
from app.errors import OpenAIError, not_found
from app.ids import new_id
from app.schemas.common import ListObject
from app.schemas.webhooks import (
    CreateWebhookEndpointRequest,
    UpdateWebhookEndpointRequest,
    WebhookDeliveryObject,
    WebhookEndpointObject,
    WebhookEndpointWithSecret,
)
from app.services.auth import Principal
from app.services.pagination import Pages, check_limit
from app.services.webhook_targets import check_url

DEFAULT_LIST_LIMIT = 20
MAX_LIST_LIMIT = 100
ROTATION_GRACE_SECONDS = 24 * 3600
_ENDPOINT_PAGES = Pages(WebhookEndpoint, scope=[])
_PROJECT_ENDPOINT_PAGES = Pages(
    WebhookEndpoint, scope=[WebhookEndpoint.project_id == bindparam("project_id")]
)
_DELIVERY_PAGES = Pages(
    WebhookDelivery, scope=[WebhookDelivery.endpoint_id == bindparam("endpoint_id")]
)


def scope_of(session: Session, principal: Principal, project: str | None) -> str | None:
    """The project a call manages: the key's own, an admin's named one, or (None) any."""
    if project is None:
        return None if principal.is_admin else principal.project_id
    project_id = session.scalar(select(Project.id).where(Project.name == project))
    if project_id is None:
        raise OpenAIError(f"No such project: {project!r}.", status_code=404, param="project")
    if not principal.is_admin and project_id != principal.project_id:
        raise OpenAIError(
            "Only an admin key may manage another project's webhook endpoints.",
            status_code=403,
            param="project",
        )
    return project_id


def create_endpoint(
    session: Session,
    settings: Settings,
    principal: Principal,
    params: CreateWebhookEndpointRequest,
) -> WebhookEndpointWithSecret:
    """For the key's project, or for `params.project` (an admin's)."""
    now = int(time.time())
    endpoint = WebhookEndpoint(
        id=new_id("we_"),
        project_id=scope_of(session, principal, params.project) or principal.project_id,
        name=params.name,
        url=check_url(params.url, settings.webhook_allow_private),
        event_types=sorted(set(params.event_types)),
        enabled=params.enabled,
        secret=new_secret(),
        created_at=now,
        updated_at=now,
    )
    session.add(endpoint)
    session.flush()
    return with_secret(endpoint)


def find_endpoint(session: Session, project_id: str | None, endpoint_id: str) -> WebhookEndpoint:
    endpoint = session.scalar(
        select(WebhookEndpoint).where(WebhookEndpoint.id == endpoint_id, *_scope(project_id))
    )
    if endpoint is None:
        raise not_found("webhook endpoint", endpoint_id, param="webhook_endpoint_id")
    return endpoint


def get_endpoint(
    session: Session, project_id: str | None, endpoint_id: str
) -> WebhookEndpointObject:
    return to_wire(find_endpoint(session, project_id, endpoint_id))


def list_endpoints(
    session: Session, project_id: str | None, after: str | None, limit: int
) -> ListObject[WebhookEndpointObject]:
    """Newest first."""
    check_limit(limit, MAX_LIST_LIMIT)
    pages, params = (
        (_ENDPOINT_PAGES, {})
        if project_id is None
        else (_PROJECT_ENDPOINT_PAGES, {"project_id": project_id})
    )
    page = pages.page(session, params, after=after, limit=limit, order="desc")
    return ListObject[WebhookEndpointObject].of([to_wire(e) for e in page.rows], page.has_more)


def every_endpoint(
    session: Session, limit: int = MAX_LIST_LIMIT
) -> list[tuple[WebhookEndpoint, str, list[WebhookDelivery]]]:
    """Every project's endpoints (newest first) with the project's name and recent deliveries."""
    rows = session.execute(
        select(WebhookEndpoint, Project.name)
        .join(Project, Project.id == WebhookEndpoint.project_id)
        .order_by(WebhookEndpoint.seq.desc())
        .limit(limit)
    ).all()
    return [(endpoint, name, recent_deliveries(session, endpoint.id)) for endpoint, name in rows]


def recent_deliveries(session: Session, endpoint_id: str, limit: int = 10) -> list[WebhookDelivery]:
    return list(
        session.scalars(
            select(WebhookDelivery)
            .where(WebhookDelivery.endpoint_id == endpoint_id)
            .order_by(WebhookDelivery.seq.desc())
            .limit(limit)
        )
    )


def list_project_endpoints(
    session: Session, principal: Principal, project: str | None, after: str | None, limit: int
) -> ListObject[WebhookEndpointObject]:
    return list_endpoints(session, scope_of(session, principal, project), after, limit)


def update_endpoint(
    session: Session,
    settings: Settings,
    project_id: str | None,
    endpoint_id: str,
    params: UpdateWebhookEndpointRequest,
) -> WebhookEndpointObject:
    endpoint = find_endpoint(session, project_id, endpoint_id)
    changes = {
        "name": params.name,
        "url": params.url and check_url(params.url, settings.webhook_allow_private),
        "event_types": params.event_types and sorted(set(params.event_types)),
        "enabled": params.enabled,
    }
    changed = False
    for name, value in changes.items():
        if value is not None and value != getattr(endpoint, name):
            setattr(endpoint, name, value)
            changed = True
    if changed:
        endpoint.updated_at = int(time.time())
    return to_wire(endpoint)


def delete_endpoint(session: Session, project_id: str | None, endpoint_id: str) -> str:
    endpoint = find_endpoint(session, project_id, endpoint_id)
    session.execute(delete(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint.id))
    session.delete(endpoint)
    return endpoint_id


def rotate_secret(
    session: Session, project_id: str | None, endpoint_id: str, keep_old: bool
) -> WebhookEndpointWithSecret:
    """A new secret; with `keep_old`, deliveries are signed with both for 24 hours."""
    endpoint = find_endpoint(session, project_id, endpoint_id)
    now = int(time.time())
    endpoint.previous_secret = endpoint.secret if keep_old else None
    endpoint.previous_secret_expires_at = now + ROTATION_GRACE_SECONDS if keep_old else None
    endpoint.secret = new_secret()
    endpoint.updated_at = now
    return with_secret(endpoint)


def signing_secrets(endpoint: WebhookEndpoint, now: float) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and one being retired."""
    expires = endpoint.previous_secret_expires_at
    if endpoint.previous_secret and expires is not None and now < expires:
        return [endpoint.secret, endpoint.previous_secret]
    return [endpoint.secret]


def list_deliveries(
    session: Session, project_id: str | None, endpoint_id: str, after: str | None, limit: int
) -> ListObject[WebhookDeliveryObject]:
    """The endpoint's deliveries, newest first."""
    find_endpoint(session, project_id, endpoint_id)
    check_limit(limit, MAX_LIST_LIMIT)
    page = _DELIVERY_PAGES.page(
        session, {"endpoint_id": endpoint_id}, after=after, limit=limit, order="desc"
    )
    return ListObject[WebhookDeliveryObject].of(
        [delivery_to_wire(d) for d in page.rows], page.has_more
    )


def _scope(project_id: str | None) -> list[ColumnElement[bool]]:
    return [] if project_id is None else [WebhookEndpoint.project_id == project_id]


def to_wire(endpoint: WebhookEndpoint) -> WebhookEndpointObject:
    return WebhookEndpointObject(
        id=endpoint.id,
        name=endpoint.name,
        url=endpoint.url,
        event_types=list(endpoint.event_types),
        signing_secret_hint=secret_hint(endpoint.secret),
        created_at=endpoint.created_at,
        updated_at=endpoint.updated_at,
        enabled=endpoint.enabled,
    )


def with_secret(endpoint: WebhookEndpoint) -> WebhookEndpointWithSecret:
    return WebhookEndpointWithSecret(
        **to_wire(endpoint).model_dump(), signing_secret=endpoint.secret
    )


def delivery_to_wire(delivery: WebhookDelivery) -> WebhookDeliveryObject:
    pending = delivery.status == "pending"
    return WebhookDeliveryObject(
        id=delivery.id,
        webhook_endpoint_id=delivery.endpoint_id,
        event_id=delivery.event_id,
        event_type=delivery.event_type,
        status=delivery.status,
        attempts=delivery.attempts,
        created_at=delivery.created_at,
        next_attempt_at=delivery.next_attempt_at if pending else None,
        last_attempt_at=delivery.last_attempt_at,
        last_status_code=delivery.last_status_code,
        last_error=delivery.last_error,
        latency_ms=delivery.latency_ms,
        delivered_at=delivery.delivered_at,
    )
