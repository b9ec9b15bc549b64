"""The outbox: a batch's webhook event, written in the transaction that ends the batch.

One `webhook_deliveries` row per enabled endpoint of the project that subscribes to the
event. Nothing is sent here; the deliverer (`webhook_delivery`) sends what is due, so an
event is never lost between the batch's commit and the HTTP request.
"""

import secrets

import orjson
from sqlalchemy import select
from sqlalchemy.orm import Session

from app.core.states import WebhookEventType
from app.db.models import WebhookDelivery, WebhookEndpoint


def event_body(event_id: str, event_type: WebhookEventType, created_at: int, batch_id: str) -> str:
    """OpenAI's payload of a batch event (`openai.types.webhooks.Batch*WebhookEvent`)."""
    event = {
        "id": event_id,
        "object": "event",
        "created_at": created_at,
        "type": str(event_type),
        "data": {"id": batch_id},
    }
    return orjson.dumps(event).decode()


def new_event_id() -> str:
    return "evt_" + secrets.token_hex(16)


def new_webhook_id() -> str:
    return "wh_" + secrets.token_hex(16)


def new_delivery(
    endpoint_id: str, event_id: str, event_type: WebhookEventType, body: str, now: float
) -> WebhookDelivery:
    return WebhookDelivery(
        id=new_webhook_id(),
        endpoint_id=endpoint_id,
        event_id=event_id,
        event_type=str(event_type),
        body=body,
        attempts=0,
        created_at=now,
        next_attempt_at=now,
    )


def enqueue_batch_event(
    session: Session, project_id: str, batch_id: str, event_type: WebhookEventType, now: int
) -> int:
    """Records the event for every subscribed endpoint; returns how many deliveries."""
    endpoints = session.scalars(
        select(WebhookEndpoint).where(
            WebhookEndpoint.project_id == project_id, WebhookEndpoint.enabled.is_(True)
        )
    ).all()
    targets = [e for e in endpoints if event_type in e.event_types]
    if not targets:
        return 0
    event_id = new_event_id()
    body = event_body(event_id, event_type, now, batch_id)
    session.add_all(new_delivery(e.id, event_id, event_type, body, now) for e in targets)
    return len(targets)
