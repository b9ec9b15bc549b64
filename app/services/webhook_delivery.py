"""Sending webhook deliveries: claim what is due under a lease, POST it signed, record it.

Any process running housekeeping delivers. A claim is a lease (`lease_owner`,
`lease_expires_at`) taken with `FOR UPDATE SKIP LOCKED` on PostgreSQL (SQLite's write
lock serializes claims), so a deliverer that dies mid-request leaves a lease that lapses and
the delivery is sent again: at least once, with the same `webhook-id` (the row's id) and
the same body every time. A failed attempt is retried with exponential backoff until
`webhook_retry_window_seconds` after the event.
"""

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core import webhook_signing
from app.core.states import DeliveryStatus, WebhookEventType
from app.db.models import WebhookDelivery, WebhookEndpoint
from app.db.session import session_scope
from app.errors import OpenAIError
from app.schemas.webhooks import WebhookEndpointTestResult
from app.services.webhook_endpoints import find_endpoint, signing_secrets
from app.services.webhook_outbox import event_body, new_delivery, new_event_id, new_webhook_id
from app.services.webhook_targets import TargetRefused, pin

log = logging.getLogger("overnight.webhooks")

CLAIMS_PER_PASS = 32
SENDERS = 8
MAX_BACKOFF_SECONDS = 3600.0
TEST_BATCH_ID = "batch_test"
_ERROR_CHARS = 500


@dataclass(frozen=True)
class Due:
    """A claimed delivery: what to send, where, signed with what."""

    id: str
    url: str
    body: str
    signing_secrets: list[str]


@dataclass(frozen=True)
class Attempt:
    status_code: int | None
    error: str | None
    latency_ms: float

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def deliver_due(settings: Settings, owner: str) -> int:
    """Sends every delivery that is due now; returns how many were accepted."""
    claimed = claim(settings, owner, time.time())
    if not claimed:
        return 0

    def deliver(due: Due) -> bool:
        attempt = send(settings, due)
        record(settings, owner, due.id, attempt)
        return attempt.ok

    with ThreadPoolExecutor(max_workers=min(SENDERS, len(claimed))) as pool:
        return sum(pool.map(deliver, claimed))


def claim(settings: Settings, owner: str, now: float) -> list[Due]:
    """Leases up to `CLAIMS_PER_PASS` due deliveries of enabled endpoints, counting an attempt."""
    lease = 4 * settings.webhook_timeout_seconds + settings.lease_seconds
    with session_scope(settings) as session:
        rows = session.execute(
            select(WebhookDelivery, WebhookEndpoint)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .where(
                WebhookDelivery.status == DeliveryStatus.PENDING,
                WebhookDelivery.next_attempt_at <= now,
                or_(
                    WebhookDelivery.lease_expires_at.is_(None),
                    WebhookDelivery.lease_expires_at < now,
                ),
                WebhookEndpoint.enabled.is_(True),
            )
            .order_by(WebhookDelivery.next_attempt_at)
            .limit(CLAIMS_PER_PASS)
            .with_for_update(skip_locked=True, of=WebhookDelivery)
        ).all()
        claimed = []
        for delivery, endpoint in rows:
            delivery.lease_owner, delivery.lease_expires_at = owner, now + lease
            delivery.attempts += 1
            delivery.last_attempt_at = now
            claimed.append(
                Due(delivery.id, endpoint.url, delivery.body, signing_secrets(endpoint, now))
            )
        return claimed


def send(settings: Settings, due: Due) -> Attempt:
    """One signed POST, to the checked address of the URL's host, with a short timeout."""
    start = time.monotonic()
    body = due.body.encode()
    try:
        target = pin(due.url, settings.webhook_allow_private)
        headers = {
            **webhook_signing.headers(due.signing_secrets, due.id, int(time.time()), body),
            "content-type": "application/json",
            "host": target.host_header,
            "user-agent": "overnight-webhooks",
        }
        with httpx.Client(timeout=settings.webhook_timeout_seconds) as http:
            response = http.post(
                target.url, content=body, headers=headers, extensions={"sni_hostname": target.host}
            )
    except (TargetRefused, httpx.HTTPError) as exc:
        return Attempt(None, _describe(exc), _ms_since(start))
    latency = _ms_since(start)
    if 200 <= response.status_code < 300:
        return Attempt(response.status_code, None, latency)
    error = f"HTTP {response.status_code}: {response.text[:_ERROR_CHARS]}".strip()
    return Attempt(response.status_code, error, latency)


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, TargetRefused) else f"{type(exc).__name__}: {text}"


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)


def backoff_seconds(settings: Settings, attempts: int) -> float:
    """The wait after the `attempts`-th failed attempt: doubling from the first retry's."""
    return min(settings.webhook_retry_seconds * 2 ** (attempts - 1), MAX_BACKOFF_SECONDS)


def record(settings: Settings, owner: str, delivery_id: str, attempt: Attempt) -> None:
    """Records the attempt, if this owner still holds the lease; schedules the next one."""
    with session_scope(settings) as session:
        delivery = session.scalar(
            select(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id, WebhookDelivery.lease_owner == owner)
            .with_for_update()
        )
        if delivery is None:
            return  # the lease lapsed and another deliverer took it over
        delivery.lease_owner, delivery.lease_expires_at = None, None
        _apply(settings, delivery, attempt, time.time())


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
    due = Due(new_webhook_id(), endpoint.url, body, signing_secrets(endpoint, now))
    return TestEvent(endpoint.id, event_id, event_type, due, now)


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
