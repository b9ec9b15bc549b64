"""Projects and what belongs to them: API keys, fair-share clocks, enqueued limits, online usage."""

from sqlalchemy import BigInteger, Float, ForeignKey, String
from sqlalchemy.orm import Mapped, mapped_column

from app.core.states import BatchStep
from app.db.models.base import Base, PublicId, check_in, enum_type
from app.schemas.admin import KeyRole


class Project(PublicId, Base):
    __tablename__ = "projects"

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
    took up, divided by its weight (`app.services.steps.step_share`)."""

    __tablename__ = "project_step_shares"
    __table_args__ = (check_in("step", BatchStep),)

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    step: Mapped[BatchStep] = mapped_column(enum_type(BatchStep, 16), primary_key=True)
    vtime: Mapped[float] = mapped_column(Float, default=0.0)


class ApiKey(PublicId, Base):
    __tablename__ = "api_keys"
    __table_args__ = (check_in("role", KeyRole),)

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    name: Mapped[str] = mapped_column(String(256), default="")
    # sha256 hex of the secret; the secret itself is never stored.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    redacted: Mapped[str] = mapped_column(String(32))
    role: Mapped[KeyRole] = mapped_column(enum_type(KeyRole, 16), default=KeyRole.MEMBER)
    created_at: Mapped[int] = mapped_column(BigInteger)
    revoked_at: Mapped[int | None] = mapped_column(BigInteger)


class ProjectLimit(Base):
    """A project's own enqueued limits on one model; None: the settings' default for it."""

    __tablename__ = "project_limits"

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), primary_key=True)
    model: Mapped[str] = mapped_column(String(256), primary_key=True)
    token_limit: Mapped[int | None] = mapped_column(BigInteger)
    request_limit: Mapped[int | None] = mapped_column(BigInteger)


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
