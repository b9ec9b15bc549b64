"""Sending webhook deliveries: claim what is due under a lease, POST it signed, record it.

Any process running housekeeping delivers. A claim is a lease (`lease_owner`,
`lease_expires_at`) taken with `FOR UPDATE SKIP LOCKED` on PostgreSQL (SQLite's write
lock serializes claims), so a deliverer that dies mid-request leaves a lease that lapses and
the delivery is sent again: at least once, with the same `webhook-id` (the row's id) and
the same body every time. Leases, due times and backoffs are on the database's clock
(`app.services.lease`), so no deliverer takes a lease early for its clock running ahead. A
failed attempt is retried with exponential backoff until
`webhook_retry_window_seconds` after the event.

A pass claims only what the senders have room for (`webhook_senders`, and
`webhook_sends_per_endpoint` per endpoint) and starts each attempt without waiting for it,
so a slow receiver's deliveries stay pending in the table, unleased, while other endpoints'
go out; the next pass (woken as each attempt ends) takes what is due then.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import DeliveryStatus, WebhookEventType
from app.db.clock import db_now, read_db_now
from app.db.models import WebhookDelivery, WebhookEndpoint
from app.db.session import session_scope
from app.errors import OpenAIError
from app.schemas.webhooks import WebhookEndpointTestResult
from app.services import lease as leases
from app.services.webhook_attempt import Attempt, Due, send
from app.services.webhook_endpoints import find_endpoint, signing_secrets
from app.services.webhook_outbox import event_body, new_delivery, new_event_id, new_webhook_id
from app.services.webhook_senders import Room, senders

log = logging.getLogger("overnight.webhooks")

CLAIMS_PER_PASS = 32
MAX_BACKOFF_SECONDS = 3600.0
TEST_BATCH_ID = "batch_test"


async def deliver_due(settings: Settings, owner: str, then: Callable[[], None]) -> int:
    """Starts an attempt at every due delivery there is room for, and waits for none of them;
    `then` is called as each ends (a slot is free again). Returns how many it started."""
    pool = senders(settings)
    started = 0
    while pool.free() > 0:
        room = pool.reserve()
        try:
            claimed = await pool.in_thread(claim, settings, owner, room)
            for due in claimed:
                pool.start(due.endpoint_id, _deliver(settings, owner, due, then))
        finally:
            pool.unreserve(room)
        if not claimed:
            break
        started += len(claimed)
    return started


async def _deliver(settings: Settings, owner: str, due: Due, then: Callable[[], None]) -> None:
    try:
        attempt = await send(settings, due)
        await senders(settings).in_thread(record, settings, owner, due.id, attempt)
    finally:
        then()


def claim(settings: Settings, owner: str, room: Room) -> list[Due]:
    """Leases the due deliveries of enabled endpoints that `room` has slots for, oldest first,
    counting an attempt; a delivery left out is not touched."""
    lease = 4 * settings.webhook_timeout_seconds + settings.lease_seconds
    with session_scope(settings) as session:
        claimed = []
        for delivery, endpoint, now in session.execute(_due(room.full())).all():
            if not room.take(endpoint.id):
                continue
            delivery.lease_owner, delivery.lease_expires_at = owner, now + lease
            delivery.attempts += 1
            delivery.last_attempt_at = now
            signing = signing_secrets(endpoint, now)
            claimed.append(Due(delivery.id, endpoint.id, endpoint.url, delivery.body, signing))
        return claimed


def _due(full: list[str]) -> Select[WebhookDelivery, WebhookEndpoint, float]:
    """Up to `CLAIMS_PER_PASS` unleased due deliveries, none to an endpoint in `full`, with
    the database's time they were found due at."""
    return (
        select(WebhookDelivery, WebhookEndpoint, db_now())
        .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
        .where(
            WebhookDelivery.status == DeliveryStatus.PENDING,
            WebhookDelivery.next_attempt_at <= db_now(),
            leases.lapsed(WebhookDelivery.lease_expires_at),
            WebhookEndpoint.enabled.is_(True),
            WebhookDelivery.endpoint_id.not_in(full),
        )
        .order_by(WebhookDelivery.next_attempt_at)
        .limit(CLAIMS_PER_PASS)
        .with_for_update(skip_locked=True, of=WebhookDelivery)
    )


def backoff_seconds(settings: Settings, attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt: doubling from the first retry's."""
    return min(settings.webhook_retry_seconds * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)


def record(settings: Settings, owner: str, delivery_id: str, attempt: Attempt) -> None:
    """Records the attempt, if this owner still holds the lease; schedules the next one."""
    with session_scope(settings) as session:
        delivery = session.scalar(
            select(WebhookDelivery)
            .where(
                WebhookDelivery.id == delivery_id, leases.held(WebhookDelivery.lease_owner, owner)
            )
            .with_for_update()
        )
        if delivery is None:
            return  # the lease lapsed and another deliverer took it over
        delivery.lease_owner, delivery.lease_expires_at = None, None
        _apply(settings, delivery, attempt, read_db_now(session))


def _apply(settings: Settings, delivery: WebhookDelivery, attempt: Attempt, now: float) -> None:
    delivery.last_status_code = attempt.status_code
    delivery.last_error = attempt.error
    delivery.latency_ms = attempt.latency_ms
    if attempt.ok:
        delivery.status, delivery.delivered_at = DeliveryStatus.DELIVERED, now
        return
    retry_at = now + backoff_seconds(settings, delivery.attempts)
    if retry_at > delivery.created_at + settings.webhook_retry_window_seconds:
        delivery.status = DeliveryStatus.FAILED
        log.warning("webhook %s given up after %d attempts", delivery.id, delivery.attempts)
    else:
        delivery.next_attempt_at = retry_at


@dataclass(frozen=True)
class TestEvent:
    """A sample event for one endpoint, sent at once rather than through the outbox."""

    endpoint_id: str
    event_id: str
    event_type: WebhookEventType
    due: Due
    created_at: float


def prepare_test(
    session: Session, project_id: str | None, endpoint_id: str, event_type: WebhookEventType
) -> TestEvent:
    """The sample event (its batch id is `batch_test`), signed as a real one is."""
    endpoint = find_endpoint(session, project_id, endpoint_id)
    now = time.time()
    event_id = new_event_id()
    body = event_body(event_id, event_type, int(now), TEST_BATCH_ID)
    due = Due(new_webhook_id(), endpoint.id, endpoint.url, body, signing_secrets(endpoint, now))
    return TestEvent(endpoint.id, event_id, event_type, due, now)


async def send_test(settings: Settings, test: TestEvent) -> Attempt:
    """The test event's attempt in a slot of its endpoint's, all within one deadline: a
    test of an endpoint whose slots stay taken fails then, as a silent receiver does."""
    pool = senders(settings)
    deadline = asyncio.get_running_loop().time() + settings.webhook_timeout_seconds
    if not await pool.acquire(test.endpoint_id, deadline):
        busy = f"{pool.per_endpoint} attempts to this endpoint (or {pool.total} in all) were"
        waited = round(settings.webhook_timeout_seconds * 1000, 1)
        return Attempt(None, f"TimeoutError: {busy} under way until the deadline", waited)
    try:
        return await send(settings, test.due, deadline)
    finally:
        pool.release(test.endpoint_id)


def record_test(
    session: Session, test: TestEvent, attempt: Attempt
) -> WebhookEndpointTestResult | None:
    """Records the sent test event with the deliveries (never retried); None if unreachable."""
    delivery = new_delivery(
        test.endpoint_id, test.event_id, test.event_type, test.due.body, test.created_at
    )
    delivery.id, delivery.attempts, delivery.last_attempt_at = test.due.id, 1, test.created_at
    delivery.last_status_code, delivery.last_error = attempt.status_code, attempt.error
    delivery.latency_ms = attempt.latency_ms
    delivery.status = DeliveryStatus.DELIVERED if attempt.ok else DeliveryStatus.FAILED
    delivery.delivered_at = time.time() if attempt.ok else None
    session.add(delivery)
    if attempt.status_code is None:
        return None
    return WebhookEndpointTestResult(
        webhook_endpoint_id=test.endpoint_id,
        event_type=str(test.event_type),
        status_code=attempt.status_code,
    )


def unreachable(attempt: Attempt) -> OpenAIError:
    """The error of a test event that got no HTTP answer at all."""
    return OpenAIError(
        f"The test event could not be delivered: {attempt.error}",
        param="url",
        code="webhook_unreachable",
    )
