"""Wire shapes of the admin API (`/v1/admin/...`): projects, API keys, workers."""

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
