"""Database tables. Wire shapes live in `app.schemas`; these are storage rows.

Public ids (`file-…`, `batch_…`) are unique strings; every table also has an
integer `seq` so that lists page in creation order with no ties.
Timestamps shown to users are Unix seconds (int); lease clocks are float seconds.
"""

from enum import StrEnum
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.core.states import (
    CLAIMABLE_BATCH_STATUSES,
    OPEN_SHARD_STATUSES,
    BatchApi,
    BatchStatus,
    BatchStep,
    DeliveryStatus,
    ShardStatus,
)
from app.schemas.admin import KeyRole
from app.schemas.files import FileObjectPurpose, FileStatus
from app.schemas.uploads import UploadStatus

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def _in(column: str, values: tuple[StrEnum, ...] | type[StrEnum]) -> str:
    return f"{column} IN ({', '.join(repr(str(v)) for v in values)})"


def _enum(enum: type[StrEnum], length: int) -> Enum:
    """A `VARCHAR` holding the enum's values; the table's CHECK constraint guards it."""
    return Enum(
        enum,
        native_enum=False,
        create_constraint=False,
        length=length,
        values_callable=lambda members: [m.value for m in members],
    )


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    type_annotation_map: ClassVar[dict[Any, Any]] = {dict[str, Any]: JSON, list[Any]: JSON}


class Project(Base):
    __tablename__ = "projects"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    created_at: Mapped[int] = mapped_column(BigInteger)
    # Its share of a model's workers against other projects with work for it (fair share).
    weight: Mapped[float] = mapped_column(Float, default=1.0, server_default="1")
    # Its own quotas (`app.services.quotas`); None: the deployment's `project_max_*`.
    max_stored_bytes: Mapped[int | None] = mapped_column(BigInteger)
    max_files: Mapped[int | None] = mapped_column(BigInteger)
    max_open_uploads: Mapped[int | None] = mapped_column(BigInteger)
    max_unfinished_batches: Mapped[int | None] = mapped_column(BigInteger)


class ProjectShare(Base):
    """A project's fair-share clock on one model: work served divided by its weight.

    A project that comes back after being idle restarts at the busiest clock's minimum
    (`app.services.schedule.admit`), so idle time is not banked.
    """

    __tablename__ = "project_shares"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    vtime: Mapped[float] = mapped_column(Float, default=0.0)
    work_done: Mapped[int] = mapped_column(BigInteger, default=0)


class ProjectStepShare(Base):
    """A project's fair-share clock on a batch-level step: the work of its batches the step
    took up, divided by its weight (`app.services.step_share`)."""

    __tablename__ = "project_step_shares"
    __table_args__ = (CheckConstraint(_in("step", BatchStep), name="step"),)

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    step: Mapped[BatchStep] = mapped_column(_enum(BatchStep, 16), primary_key=True)
    vtime: Mapped[float] = mapped_column(Float, default=0.0)


class ApiKey(Base):
    __tablename__ = "api_keys"
    __table_args__ = (CheckConstraint(_in("role", KeyRole), name="role"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    # sha256 hex of the secret; the secret itself is never stored.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    redacted: Mapped[str] = mapped_column(String(32))
    role: Mapped[KeyRole] = mapped_column(_enum(KeyRole, 16), default=KeyRole.MEMBER)
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)


class File(Base):
    __tablename__ = "files"
    __table_args__ = (
        CheckConstraint(_in("status", FileStatus), name="status"),
        Index("ix_files_project_listing", "project_id", "seq"),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    filename: Mapped[str] = mapped_column(Text)
    purpose: Mapped[FileObjectPurpose] = mapped_column(_enum(FileObjectPurpose, 32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(512))
    status: Mapped[FileStatus] = mapped_column(_enum(FileStatus, 16), default=FileStatus.PROCESSED)
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, index=True)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger)


class Upload(Base):
    __tablename__ = "uploads"
    __table_args__ = (CheckConstraint(_in("status", UploadStatus), name="status"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    filename: Mapped[str] = mapped_column(Text)
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    mime_type: Mapped[str] = mapped_column(String(256))
    status: Mapped[UploadStatus] = mapped_column(
        _enum(UploadStatus, 16), default=UploadStatus.PENDING
    )
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)
    # Expiry the completed File gets, in seconds after its creation.
    file_expires_after: Mapped[int | None] = mapped_column(BigInteger)
    file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"))


class UploadPart(Base):
    __tablename__ = "upload_parts"

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id"), index=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[int] = mapped_column(BigInteger)


class ProgressColumns:
    """The columns of `app.core.progress.Progress` (same names), shared by `Batch` and `Shard`."""

    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    reasoning_tokens: Mapped[int] = mapped_column(BigInteger, default=0)


class Batch(ProgressColumns, Base):
    __tablename__ = "batches"
    __table_args__ = (
        CheckConstraint(_in("status", BatchStatus), name="status"),
        CheckConstraint(_in("api", BatchApi), name="api"),
        Index("ix_batches_project_listing", "project_id", "seq"),
        # The validator's and finalizer's claim path.
        Index(
            "ix_batches_claimable",
            "status",
            postgresql_where=text(_in("status", CLAIMABLE_BATCH_STATUSES)),
            sqlite_where=text(_in("status", CLAIMABLE_BATCH_STATUSES)),
        ),
        # The shard claim's and the planner's path: running batches, by model.
        Index(
            "ix_batches_running",
            "model",
            postgresql_where=text(_in("status", (BatchStatus.IN_PROGRESS,))),
            sqlite_where=text(_in("status", (BatchStatus.IN_PROGRESS,))),
        ),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    endpoint: Mapped[str] = mapped_column(String(64))
    # Which API shows it: an Anthropic Message Batch is this batch with `/v1/messages` lines.
    api: Mapped[BatchApi] = mapped_column(
        _enum(BatchApi, 16), default=BatchApi.OPENAI, server_default=BatchApi.OPENAI.value
    )
    input_file_id: Mapped[str] = mapped_column(ForeignKey("files.id"))
    model: Mapped[str | None] = mapped_column(String(256))
    completion_window: Mapped[str] = mapped_column(String(16))
    status: Mapped[BatchStatus] = mapped_column(
        _enum(BatchStatus, 16), default=BatchStatus.VALIDATING
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

    # Scheduling (app/services/schedule.py, worker/claim.py). Work served (output tokens, or
    # input tokens, or requests: `app.core.schedule.work_of`) and the batch's fair-share clock
    # inside its project; `urgent_deadline` is `expires_at` while the planner finds the
    # batch at risk under fair share (it then goes first, earliest deadline first).
    work_done: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    vtime: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    urgent_deadline: Mapped[int | None] = mapped_column(BigInteger)
    expected_miss: Mapped[bool] = mapped_column(Boolean, default=False, server_default="0")
    eta_start_at: Mapped[float | None] = mapped_column(Float)
    eta_finish_at: Mapped[float | None] = mapped_column(Float)
    eta_made_at: Mapped[float | None] = mapped_column(Float)

    # Lease for the batch-level steps (validation, finalization).
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    # A batch-level step that raised: how many times in a row, and not tried again before
    # `step_retry_at` (`app.services.batch_lease.fail`).
    step_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    step_retry_at: Mapped[float | None] = mapped_column(Float)


class Shard(ProgressColumns, Base):
    """A run of consecutive input lines that one worker processes under a lease."""

    __tablename__ = "shards"
    __table_args__ = (
        CheckConstraint(_in("status", ShardStatus), name="status"),
        UniqueConstraint("batch_id", "index", name="uq_shards_batch_index"),
        Index(
            "ix_shards_claimable",
            "batch_id",
            "status",
            postgresql_where=text(_in("status", OPEN_SHARD_STATUSES)),
            sqlite_where=text(_in("status", OPEN_SHARD_STATUSES)),
        ),
        # The claim's path: batches in the schedule's order, then each one's open shards in
        # index order (worker/claim.py), so no claim sorts every open shard.
        Index(
            "ix_shards_claim_order",
            "batch_id",
            "index",
            postgresql_where=text(_in("status", OPEN_SHARD_STATUSES)),
            sqlite_where=text(_in("status", OPEN_SHARD_STATUSES)),
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
    status: Mapped[ShardStatus] = mapped_column(_enum(ShardStatus, 16), default=ShardStatus.PENDING)
    lease_owner: Mapped[str | None] = mapped_column(String(128))
    # The worker that last claimed it, kept after the lease ends.
    last_owner: Mapped[str | None] = mapped_column(String(128))
    lease_epoch: Mapped[int] = mapped_column(Integer, default=0)
    heartbeat_at: Mapped[float | None] = mapped_column(Float)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    # The prompt tokens its lines enqueue, as validation estimated them (app/services/enqueued).
    prompt_tokens: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # Progress columns, as last checkpointed: always the sums over this shard's result chunks.


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


class SingletonLease(Base):
    """A step one process does at a time, and who does it (`app.services.singleton_lease`)."""

    __tablename__ = "singleton_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(128))
    expires_at: Mapped[float] = mapped_column(Float)


class ProjectLimit(Base):
    """A project's own enqueued limits on one model; None: the settings' default for it."""

    __tablename__ = "project_limits"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    token_limit: Mapped[int | None] = mapped_column(BigInteger)
    request_limit: Mapped[int | None] = mapped_column(BigInteger)


class RegisteredWorker(Base):
    """A worker process as the registry records it, for the dashboard and lease decisions."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(256))
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    current_shard_id: Mapped[int | None] = mapped_column(Integer)
    tokens_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    stopped_at: Mapped[float | None] = mapped_column(Float)
    # None while the engine loads: the row is written before the engine starts.
    ready_at: Mapped[float | None] = mapped_column(Float)
    # What the engine runs with (`worker.engine.configuration_of`), for the dashboard.
    engine_configuration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The engine scheduler's gauges at the last heartbeat (vLLM's own stats).
    engine_running: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    engine_waiting: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    kv_cache_usage: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class WebhookEndpoint(Base):
    """Where a project's batch events are sent, signed with its secret."""

    __tablename__ = "webhook_endpoints"
    __table_args__ = (Index("ix_webhook_endpoints_project_listing", "project_id", "seq"),)

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
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


class WebhookDelivery(Base):
    """One event for one endpoint: the outbox row, written with the batch's terminal status.

    `body` is the exact payload sent on every attempt, and `id` its `webhook-id`.
    """

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        CheckConstraint(_in("status", DeliveryStatus), name="status"),
        Index("ix_webhook_deliveries_endpoint_listing", "endpoint_id", "seq"),
        # The deliverer's claim path.
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text(_in("status", (DeliveryStatus.PENDING,))),
            sqlite_where=text(_in("status", (DeliveryStatus.PENDING,))),
        ),
    )

    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(64), unique=True)
    endpoint_id: Mapped[str] = mapped_column(ForeignKey("webhook_endpoints.id", ondelete="CASCADE"))
    event_id: Mapped[str] = mapped_column(String(64))
    event_type: Mapped[str] = mapped_column(String(64))
    body: Mapped[str] = mapped_column(Text)
    status: Mapped[DeliveryStatus] = mapped_column(
        _enum(DeliveryStatus, 16), default=DeliveryStatus.PENDING
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


class OnlineUsage(Base):
    """What each project's online API calls used, by model: running totals the workers add to."""

    __tablename__ = "online_usage"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    input_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    cached_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    output_tokens: Mapped[int] = mapped_column(BigInteger, default=0)
    updated_at: Mapped[float] = mapped_column(Float)
