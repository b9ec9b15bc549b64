"""A batch's move to a terminal status: the one place it happens, so no event is missed.

Validation failing a batch, and the finalizer completing, cancelling or expiring one, all
end it here, inside their own fenced transaction, which also records the webhook event.
"""

from sqlalchemy.orm import Session

from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus, WebhookEventType
from app.db.models import Batch
from app.services.webhook_outbox import enqueue_batch_event


def end_batch(session: Session, batch: Batch, status: BatchStatus, now: int) -> None:
    """Sets the terminal `status` and its timestamp, frees the lease, records the event."""
    if status not in TERMINAL_BATCH_STATUSES:
        raise ValueError(f"{status} is not a terminal batch status")
    batch.status = status
    setattr(batch, f"{status}_at", now)
    batch.lease_owner, batch.heartbeat_at = None, None
    enqueue_batch_event(session, batch.project_id, batch.id, WebhookEventType.of(status), now)
