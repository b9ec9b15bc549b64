"""Wire shapes of OpenAI's webhook endpoints API (`/v1/webhook_endpoints`) and our deliveries."""

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.core.states import DeliveryStatus, WebhookEventType
from app.schemas.common import RequestModel, inline_enum

EventTypes = Annotated[list[WebhookEventType], Field(min_length=1)]


class WebhookEndpointObject(BaseModel):
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    id: str
    name: str
    url: str
    event_types: list[str]
    signing_secret_hint: str
    created_at: int
    updated_at: int
    # Ours: a disabled endpoint keeps its settings and gets no new events.
    enabled: bool


class WebhookEndpointWithSecret(WebhookEndpointObject):
    signing_secret: str = Field(description="Shown once, at creation or rotation: store it now.")


class CreateWebhookEndpointRequest(RequestModel):
    name: str = Field(min_length=1, max_length=256)
    url: str = Field(min_length=1, max_length=2048)
    event_types: EventTypes
    enabled: bool = True
    project: str | None = Field(
        None, description="Ours: the project (by name) an admin key creates the endpoint for."
    )


class UpdateWebhookEndpointRequest(RequestModel):
    name: str | None = Field(None, min_length=1, max_length=256)
    url: str | None = Field(None, min_length=1, max_length=2048)
    event_types: EventTypes | None = None
    enabled: bool | None = None


class RotateSecretRequest(RequestModel):
    keep_old_secret_active_for_24_hours: bool = False


class TestWebhookEndpointRequest(RequestModel):
    event_type: WebhookEventType


class WebhookEndpointTestResult(BaseModel):
    object: Literal["webhook_endpoint.test"] = "webhook_endpoint.test"
    webhook_endpoint_id: str
    event_type: str
    status_code: int
    success: Literal[True] = True


class DeletedWebhookEndpoint(BaseModel):
    object: Literal["webhook_endpoint.deleted"] = "webhook_endpoint.deleted"
    id: str
    deleted: Literal[True] = True


class WebhookEventTypeList(BaseModel):
    object: Literal["list"] = "list"
    data: list[str]


class WebhookDeliveryObject(BaseModel):
    """Ours: one event's delivery to one endpoint, with its latest attempt."""

    object: Literal["webhook_delivery"] = "webhook_delivery"
    id: str = Field(description="The `webhook-id` header, the same on every attempt.")
    webhook_endpoint_id: str
    event_id: str
    event_type: str
    status: Annotated[DeliveryStatus, inline_enum(DeliveryStatus, "Status")]
    attempts: int
    created_at: float
    next_attempt_at: float | None
    last_attempt_at: float | None
    last_status_code: int | None
    last_error: str | None
    latency_ms: float | None
    delivered_at: float | None
