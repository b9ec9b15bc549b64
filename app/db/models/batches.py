"""Batches, their shards (with the LoRA adapters their lines name) and result chunks."""

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import Mapped, mapped_column

from app.core.states import (
    CLAIMABLE_BATCH_STATUSES,
    OPEN_SHARD_STATUSES,
    BatchApi,
    BatchStatus,
    ShardStatus,
)
from app.db.models.base import Base, PublicId, check_in, enum_type, one_of, partial_index


class ProgressColumns:
    """The columns of `app.core.progress.Progress` (same names), shared by `Batch` and `Shard`."""

    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class Batch(PublicId, ProgressColumns, Base):
    __tablename__ = "batches"
    __table_args__ = (
        check_in("status", BatchStatus),
        check_in("api", BatchApi),
        Index("ix_batches_project_listing", "project_id", "seq"),
        # The validator's and finalizer's claim path.
        partial_index(
            "ix_batches_claimable", "status", where=one_of("status", CLAIMABLE_BATCH_STATUSES)
        ),
        # The shard claim's and the planner's path: running batches, by model.
        partial_index(
            "ix_batches_running", "model", where=one_of("status", (BatchStatus.IN_PROGRESS,))
        ),
    )

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    endpoint: Mapped[str] = mapped_column(String(64))
    # Which API shows it: an Anthropic Message Batch is this batch with `/v1/messages` lines.
    api: Mapped[BatchApi] = mapped_column(
        enum_type(BatchApi, 16), default=BatchApi.OPENAI, server_default=BatchApi.OPENAI.value
    )
    input_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    model: Mapped[str | None] = mapped_column(String(256))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[BatchStatus] = mapped_column(
        enum_type(BatchStatus, 16), default=BatchStatus.VALIDATING
    )
    errors: Mapped[list[Any] | None] = mapped_column(JSON)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSON)
    output_file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"))
    error_file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"))
    output_expires_after: Mapped[int | None] = mapped_column(BigInteger)

    created_at: Mapped[int] = mapped_column(BigInteger)
    in_progress_at: Mapped[int | None] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger)
    finalizing_at: Mapped[int | None] = mapped_column(BigInteger)
    completed_at: Mapped[int | None] = mapped_column(BigInteger)
    failed_at: Mapped[int | None] = mapped_column(BigInteger)
    expired_at: Mapped[int | None] = mapped_column(BigInteger)
    cancelling_at: Mapped[int | None] = mapped_column(BigInteger)
    cancelled_at: Mapped[int | None] = mapped_column(BigInteger)

    # Progress columns are final once the batch is terminal; while it runs they are summed
    # from its shards.
    total: Mapped[int] = mapped_column(Integer, default=0)
    # Of `failed`, the requests that never ran because the batch was cancelled or expired.
    cancelled: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    expired: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # `[unix time, requests/s]` points kept at the end: the result chunks they come from go.
    throughput: Mapped[list[Any] | None] = mapped_column(JSON)

    # Its scheduling state (clocks, ETAs) is in `batch_schedules` (app/db/models/schedules.py).

    # Lease for the batch-level steps (validation, finalization).
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    # A batch-level step that raised: how many times in a row, and not tried again before
    # `step_retry_at` (`app.services.steps.batch_lease.fail`).
    step_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    step_retry_at: Mapped[float | None] = mapped_column(Float)


class Shard(ProgressColumns, Base):
    """A run of consecutive input lines that one worker processes under a lease."""

    __tablename__ = "shards"
    __table_args__ = (
        check_in("status", ShardStatus),
        UniqueConstraint("batch_id", "index", name="uq_shards_batch_index"),
        partial_index(
            "ix_shards_claimable", "batch_id", "status", where=one_of("status", OPEN_SHARD_STATUSES)
        ),
        # The claim's path: batches in the schedule's order, then each one's open shards in
        # index order (worker/claim.py), so no claim sorts every open shard.
        partial_index(
            "ix_shards_claim_order",
            "batch_id",
            "index",
            where=one_of("status", OPEN_SHARD_STATUSES),
        ),
        # A worker's recent shards (its dashboard page).
        Index("ix_shards_last_owner", "last_owner", "heartbeat_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    batch_id: Mapped[str] = mapped_column(ForeignKey("batches.id"))
    index: Mapped[int] = mapped_column(Integer)
    first_line: Mapped[int] = mapped_column(Integer)  # 1-based line number in the input file
    line_count: Mapped[int] = mapped_column(Integer)
    byte_start: Mapped[int] = mapped_column(BigInteger)
    byte_end: Mapped[int] = mapped_column(BigInteger)
    status: Mapped[ShardStatus] = mapped_column(
        enum_type(ShardStatus, 16), default=ShardStatus.PENDING
    )
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    # The worker that last claimed it, kept after the lease ends.
    last_owner: Mapped[str | None] = mapped_column(String(128))
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # The prompt tokens its lines enqueue, as validation estimated them (app/services/enqueued).
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Progress columns, as last checkpointed: always the sums over this shard's result chunks.


class ShardAdapter(Base):
    """A LoRA adapter a shard's lines name (validation records them): a worker with LoRA
    prefers shards whose adapters it has loaded (worker/claim.py)."""

    __tablename__ = "shard_adapters"

    shard_id: Mapped[int] = mapped_column(ForeignKey("shards.id"), primary_key=True)
    # Text: a hub adapter's name is its repo and folder, of any length.
    name: Mapped[str] = mapped_column(Text, primary_key=True)


class ResultChunk(Base):
    """An immutable stored JSONL object of finished lines, recorded under a shard lease."""

    __tablename__ = "result_chunks"
    __table_args__ = (UniqueConstraint("shard_id", "epoch", "sequence", name="uq_result_chunks"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    shard_id: Mapped[int] = mapped_column(ForeignKey("shards.id"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    sequence: Mapped[int] = mapped_column(Integer)
    storage_key: Mapped[str] = mapped_column(String(512))
    lines: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    # Its work (`app.core.schedule.work_of`): the planner's measure of a model's speed.
    work: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
