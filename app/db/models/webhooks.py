"""Webhook endpoints and their deliveries (the outbox)."""

from typing import Any

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.core.states import DeliveryStatus
from app.db.models.base import Base, PublicId, check_in, enum_type, one_of, partial_index


class WebhookEndpoint(PublicId, Base):
    """Where a project's batch events are sent, signed with its secret."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_project_listing", "project_id", "seq"),)

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    name: Mapped[str] = mapped_column(String(256))
    url: Mapped[str] = mapped_column(Text)
    event_types: Mapped[list[Any]] = mapped_column(JSON)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    # Kept in the clear: every delivery is signed with it.
    secret: Mapped[str] = mapped_column(String(128))
    # After a rotation that keeps the old secret valid, deliveries carry both signatures.
    previous_secret: Mapped[str | None] = mapped_column(String(128))
    previous_secret_expires_at: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[int] = mapped_column(BigInteger)
    updated_at: Mapped[int] = mapped_column(BigInteger)


class WebhookDelivery(PublicId, Base):
    """One event for one endpoint: the outbox row, written with the batch's terminal status.

    `body` is the exact payload sent on every attempt, and `id` its `webhook-id`.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        check_in("status", DeliveryStatus),
        Index("ix_webhook_deliveries_endpoint_listing", "endpoint_id", "seq"),
        # The deliverer's claim path.
        partial_index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            where=one_of("status", (DeliveryStatus.PENDING,)),
        ),
    )

    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[DeliveryStatus] = mapped_column(
        enum_type(DeliveryStatus, 16), default=DeliveryStatus.PENDING
    )
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    next_attempt_at: Mapped[float] = mapped_column(Float)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_expires_at: Mapped[float | None] = mapped_column(Float)
    last_attempt_at: Mapped[float | None] = mapped_column(Float)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    latency_ms: Mapped[float | None] = mapped_column(Float)
    delivered_at: Mapped[float | None] = mapped_column(Float)
