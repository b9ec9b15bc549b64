"""Wire shapes of the admin API (`/v1/admin/...`): projects (weights, limits, quotas), API
keys, workers."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.schemas.common import RequestModel, inline_enum


class KeyRole(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"


class WorkerState(StrEnum):
    LOADING = "loading"  # its engine is starting
    RUNNING = "running"
    IDLE = "idle"
    STALE = "stale"  # no heartbeat for a whole lease
    STOPPED = "stopped"


class ProjectObject(BaseModel):
    object: Literal["project"] = "project"
    id: str
    name: str
    created_at: int
    weight: float = Field(description="Its share of a model's workers against other projects.")


class UpdateProjectRequest(RequestModel):
    weight: float = Field(
        gt=0, le=1000, description="Fair-share weight; every project starts at 1."
    )


# Far above any deployment's need, within a 64-bit column.
_MAX_LIMIT = 10**15


class EnqueuedLimitsObject(BaseModel):
    """A project's enqueued limits on one model: its own where set, else the deployment's."""

    object: Literal["project.enqueued_limits"] = "project.enqueued_limits"
    project_id: str
    project_name: str
    model: str
    token_limit: int | None = Field(
        description="Estimated prompt tokens its unfinished batches may hold; null: no limit."
    )
    request_limit: int | None = Field(
        description="Requests its unfinished batches may hold; null: no limit."
    )
    token_limit_override: int | None = Field(
        description="The project's own token limit; null: the deployment's applies."
    )
    request_limit_override: int | None = Field(
        description="The project's own request limit; null: the deployment's applies."
    )


class UpdateEnqueuedLimitsRequest(RequestModel):
    """A field left out stays as it is; null puts the deployment's default back."""

    model: str = Field(min_length=1, max_length=256)
    token_limit: int | None = Field(None, ge=0, le=_MAX_LIMIT)
    request_limit: int | None = Field(None, ge=0, le=_MAX_LIMIT)


class Quota(StrEnum):
    """What a project's quotas bound (`app.services.quotas`)."""

    STORED_BYTES = "stored_bytes"
    FILES = "files"
    OPEN_UPLOADS = "open_uploads"
    UNFINISHED_BATCHES = "unfinished_batches"


class QuotaObject(BaseModel):
    used: int = Field(description="What the project holds now.")
    limit: int | None = Field(description="The quota in force; null: no limit.")
    override: int | None = Field(description="The project's own quota; null: the deployment's.")


class ProjectQuotasObject(BaseModel):
    """A project's quotas: its own where set, else the deployment's, with what it holds."""

    object: Literal["project.quotas"] = "project.quotas"
    project_id: str
    project_name: str
    stored_bytes: QuotaObject = Field(description="Bytes of its files and open uploads' parts.")
    files: QuotaObject = Field(description="Its files (batch output files included).")
    open_uploads: QuotaObject = Field(description="Its uploads neither completed nor ended.")
    unfinished_batches: QuotaObject = Field(description="Its batches not yet ended.")


class UpdateProjectQuotasRequest(RequestModel):
    """A field left out stays as it is; null puts the deployment's default back."""

    max_stored_bytes: int | None = Field(None, ge=0, le=_MAX_LIMIT)
    max_files: int | None = Field(None, ge=0, le=_MAX_LIMIT)
    max_open_uploads: int | None = Field(None, ge=0, le=_MAX_LIMIT)
    max_unfinished_batches: int | None = Field(None, ge=0, le=_MAX_LIMIT)


class ScheduledBatchObject(BaseModel):
    """Where an open batch stands in its model's schedule (ours; not on OpenAI's Batch)."""

    object: Literal["batch.schedule"] = "batch.schedule"
    batch_id: str
    project_id: str
    project_name: str
    model: str | None
    status: str
    position: int | None = Field(description="1 is served first, among its model's batches.")
    at_risk: bool = Field(description="Would miss expires_at under fair share: served first.")
    expected_to_miss: bool = Field(description="Expected to expire before it finishes.")
    expires_at: int
    estimated_start_at: float | None
    estimated_finish_at: float | None
    estimated_at: float | None = Field(description="When the planner made the estimate.")


class ApiKeyObject(BaseModel):
    """A project's API key; the secret itself is only ever shown once, at creation."""

    object: Literal["api_key"] = "api_key"
    id: str
    name: str
    project_id: str
    project_name: str
    role: Annotated[KeyRole, inline_enum(KeyRole, "Role")]
    redacted_value: str
    created_at: int
    revoked_at: int | None


class CreatedApiKey(ApiKeyObject):
    value: str = Field(description="The secret. Shown once: store it now.")


class CreateApiKeyRequest(RequestModel):
    project: str = Field(min_length=1, max_length=128, description="Project name; created if new.")
    role: Literal["admin", "member"] = "member"
    name: str = Field("", max_length=256)


class ApiKeyRevoked(BaseModel):
    object: Literal["api_key.revoked"] = "api_key.revoked"
    id: str
    revoked: Literal[True] = True


class WorkerObject(BaseModel):
    object: Literal["worker"] = "worker"
    id: str
    host: str
    pid: int
    model: str
    state: Annotated[WorkerState, inline_enum(WorkerState, "State")]
    started_at: float
    heartbeat_at: float
    heartbeat_age_seconds: float
    current_batch_id: str | None
    current_shard_index: int | None
    tokens_per_second: float
    stopped_at: float | None
