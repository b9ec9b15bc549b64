"""`/v1/webhook_endpoints`, as OpenAI's webhook endpoints API (the SDK's `client.webhooks`).

A member key sees its own project's endpoints; an admin key any project's, and creates or
lists another project's with `project` (its name). The deliveries list, `enabled` and
`project` are ours. Each `uow.run` is one committed transaction.
"""

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.body import json_post, read_json
from app.api.deps import PrincipalDep, SettingsDep, UnitOfWorkDep
from app.core.states import WebhookEventType
from app.schemas.common import ListObject
from app.schemas.webhooks import (
    CreateWebhookEndpointRequest,
    DeletedWebhookEndpoint,
    RotateSecretRequest,
    TestWebhookEndpointRequest,
    UpdateWebhookEndpointRequest,
    WebhookDeliveryObject,
    WebhookEndpointObject,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
)
from app.services import webhook_delivery, webhook_endpoints
from app.services.auth import Principal

router = APIRouter(tags=["webhooks"])


def _scope(principal: Principal) -> str | None:
    return None if principal.is_admin else principal.project_id


@router.get("/webhook_event_types", operation_id="listWebhookEventTypes")
async def list_event_types(_principal: PrincipalDep) -> WebhookEventTypeList:
    return WebhookEventTypeList(data=[str(t) for t in WebhookEventType])


@json_post(
    router, "/webhook_endpoints", CreateWebhookEndpointRequest, operation_id="createWebhookEndpoint"
)
async def create_endpoint(
    request: Request, uow: UnitOfWorkDep, settings: SettingsDep, principal: PrincipalDep
) -> WebhookEndpointWithSecret:
    """The response holds the signing secret, once."""
    params = await read_json(request, CreateWebhookEndpointRequest)
    return await uow.run(webhook_endpoints.create_endpoint, settings, principal, params)


@router.get("/webhook_endpoints", operation_id="listWebhookEndpoints")
async def list_endpoints(
    uow: UnitOfWorkDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query()] = webhook_endpoints.DEFAULT_LIST_LIMIT,
    project: Annotated[
        str | None, Query(description="Ours: an admin's view of one project (by name).")
    ] = None,
) -> ListObject[WebhookEndpointObject]:
    return await uow.run(webhook_endpoints.list_project_endpoints, principal, project, after, limit)


@router.get("/webhook_endpoints/{webhook_endpoint_id}", operation_id="retrieveWebhookEndpoint")
async def retrieve_endpoint(
    webhook_endpoint_id: str, uow: UnitOfWorkDep, principal: PrincipalDep
) -> WebhookEndpointObject:
    return await uow.run(webhook_endpoints.get_endpoint, _scope(principal), webhook_endpoint_id)


@json_post(
    router,
    "/webhook_endpoints/{webhook_endpoint_id}",
    UpdateWebhookEndpointRequest,
    operation_id="updateWebhookEndpoint",
)
async def update_endpoint(
    webhook_endpoint_id: str,
    request: Request,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> WebhookEndpointObject:
    params = await read_json(request, UpdateWebhookEndpointRequest)
    return await uow.run(
        webhook_endpoints.update_endpoint, settings, _scope(principal), webhook_endpoint_id, params
    )


@router.delete("/webhook_endpoints/{webhook_endpoint_id}", operation_id="deleteWebhookEndpoint")
async def delete_endpoint(
    webhook_endpoint_id: str, uow: UnitOfWorkDep, principal: PrincipalDep
) -> DeletedWebhookEndpoint:
    deleted = await uow.run(
        webhook_endpoints.delete_endpoint, _scope(principal), webhook_endpoint_id
    )
    return DeletedWebhookEndpoint(id=deleted)


@json_post(
    router,
    "/webhook_endpoints/{webhook_endpoint_id}/rotate_secret",
    RotateSecretRequest,
    operation_id="rotateWebhookEndpointSecret",
)
async def rotate_secret(
    webhook_endpoint_id: str, request: Request, uow: UnitOfWorkDep, principal: PrincipalDep
) -> WebhookEndpointWithSecret:
    params = await read_json(request, RotateSecretRequest)
    return await uow.run(
        webhook_endpoints.rotate_secret,
        _scope(principal),
        webhook_endpoint_id,
        params.keep_old_secret_active_for_24_hours,
    )


@json_post(
    router,
    "/webhook_endpoints/{webhook_endpoint_id}/test",
    TestWebhookEndpointRequest,
    operation_id="testWebhookEndpoint",
)
async def test_endpoint(
    webhook_endpoint_id: str,
    request: Request,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> WebhookEndpointTestResult:
    """Sends a sample event now (its `data.id` is `batch_test`) and says what the URL answered."""
    params = await read_json(request, TestWebhookEndpointRequest)
    test = await uow.run(
        webhook_delivery.prepare_test, _scope(principal), webhook_endpoint_id, params.event_type
    )
    attempt = await webhook_delivery.send_test(settings, test)
    result = await uow.run(webhook_delivery.record_test, test, attempt)
    if result is None:
        raise webhook_delivery.unreachable(attempt)
    return result


@router.get(
    "/webhook_endpoints/{webhook_endpoint_id}/deliveries", operation_id="listWebhookDeliveries"
)
async def list_deliveries(
    webhook_endpoint_id: str,
    uow: UnitOfWorkDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query()] = webhook_endpoints.DEFAULT_LIST_LIMIT,
) -> ListObject[WebhookDeliveryObject]:
    """Ours: the endpoint's deliveries, newest first, with their latest attempt."""
    return await uow.run(
        webhook_endpoints.list_deliveries, _scope(principal), webhook_endpoint_id, after, limit
    )
