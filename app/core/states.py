"""Batch and shard states, and the ways a shard run or a finalization can end."""

from enum import StrEnum


class BatchStatus(StrEnum):
    """OpenAI's batch statuses, as stored and as sent."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL_BATCH_STATUSES = (
    BatchStatus.FAILED,
    BatchStatus.COMPLETED,
    BatchStatus.EXPIRED,
    BatchStatus.CANCELLED,
)
# Not `finalizing`: every request has its result by then, so the batch completes whatever a
# cancel says (a cancel answers 200 and changes nothing).
CANCELLABLE_BATCH_STATUSES = (
    BatchStatus.VALIDATING,
    BatchStatus.IN_PROGRESS,
)
# Statuses the batch-level steps (validation, finalization) claim batches in.
CLAIMABLE_BATCH_STATUSES = (
    BatchStatus.VALIDATING,
    BatchStatus.FINALIZING,
    BatchStatus.CANCELLING,
)


class BatchApi(StrEnum):
    """The wire format a batch was created through; underneath, every batch is the same."""

    OPENAI = "openai"  # `/v1/batches`
    ANTHROPIC = "anthropic"  # `/v1/messages/batches` (Message Batches)


class BatchStep(StrEnum):
    """A batch-level step, which claims whole batches (each keeps fair-share clocks)."""

    VALIDATION = "validation"
    FINALIZATION = "finalization"


class ShardStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"


# Shards a worker may still claim (pending, or running under a lease that may lapse).
OPEN_SHARD_STATUSES = (ShardStatus.PENDING, ShardStatus.RUNNING)


class Ending(StrEnum):
    """How a finalization ends the batch, and so what an unrun request's error line says."""

    COMPLETE = "complete"
    CANCEL = "cancel"
    EXPIRE = "expire"


class ShardOutcome(StrEnum):
    """How one worker's run of a shard ended."""

    DONE = "done"  # every line has a result and the shard is closed
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    BATCH_ENDED = "batch ended"  # the batch left `in_progress` some other way
    RELEASED = "released"  # handed back as pending (the worker is stopping)
    LOST = "lost"  # someone else holds the lease now
    ABORTED = "aborted"  # the run's task was cancelled
    FAILED = "failed"  # the run raised


# The outcomes after which the batch may be ready to finalize.
FINALIZABLE_OUTCOMES = (ShardOutcome.DONE, ShardOutcome.CANCELLED, ShardOutcome.EXPIRED)


class WebhookEventType(StrEnum):
    """OpenAI's batch webhook events: one for each terminal status."""

    BATCH_COMPLETED = "batch.completed"
    BATCH_FAILED = "batch.failed"
    BATCH_EXPIRED = "batch.expired"
    BATCH_CANCELLED = "batch.cancelled"

    @classmethod
    def of(cls, status: BatchStatus) -> "WebhookEventType":
        """The event a batch ending in `status` sends."""
        return cls(f"batch.{status}")


# Every event an endpoint can subscribe to, in the enum's order (forms, the CLI's choices).
ALL_WEBHOOK_EVENTS = [str(event) for event in WebhookEventType]


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # not yet accepted; retried until the retry window closes
    DELIVERED = "delivered"  # the receiver answered 2xx
    FAILED = "failed"  # the retry window closed (or a test event was refused)
