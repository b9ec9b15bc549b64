"""`GET /v1/admin/stats`: the deployment at a glance (`app.services.stats`)."""

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.admin import WorkerState


class ModelStats(BaseModel):
    model: str = Field(description="The batches' model; empty for a batch that names none yet.")
    queued_requests: int = Field(description="Lines still to run in its in-progress batches.")
    running_batches: int
    validating_batches: int
    workers: dict[WorkerState, int] = Field(description="Its workers by state, stopped left out.")


class ProjectTokensToday(BaseModel):
    project: str
    batches: int = Field(description="Its batches that ended today (UTC) or are running.")
    input_tokens: int
    output_tokens: int


class StatsObject(BaseModel):
    object: Literal["stats"] = "stats"
    taken_at: float = Field(description="When the figures were read (Unix seconds).")
    batches: dict[str, int] = Field(description="Batches by status.")
    workers: dict[WorkerState, int] = Field(description="Workers by state, stopped left out.")
    tokens_per_second: float = Field(description="What the serving workers last reported.")
    models: list[ModelStats]
    tokens_today: list[ProjectTokensToday]
