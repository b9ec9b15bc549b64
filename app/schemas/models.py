"""Wire shapes of `/v1/models` (`openai.types.Model`), and what a worker announces it serves."""

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

# Where a worker's announcement sits in its `workers` row's `engine_configuration`.
ANNOUNCEMENT_KEY = "served"
# ... and a switching worker's models and what switching has cost (`worker.switching`).
SWITCHING_KEY = "switching"


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "overnight"
    # Ours (vLLM's server adds fields too): the batch endpoints this model serves.
    endpoints: list[str]
    # A LoRA adapter's, as vLLM's `/v1/models` gives them: its base model and its source.
    parent: str | None = None
    root: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]


class AnnouncedAdapter(BaseModel):
    """A LoRA adapter a worker's engine has loaded, as vLLM lists it."""

    name: str
    parent: str  # the served name of its base model
    root: str  # where it was loaded from


class StandbyModel(BaseModel):
    """A model a switching worker (`overnight worker --models`) loads when its queue comes
    first; its endpoints are known once the worker has held it."""

    name: str
    endpoints: list[str] | None = None


class Announcement(BaseModel):
    """What a ready worker serves: its served names and the endpoints vLLM built for its model,
    the LoRA adapters of that model a line may name instead, and the models it switches to."""

    names: list[str]
    endpoints: list[str]
    adapters: list[AnnouncedAdapter] = []
    standby: list[StandbyModel] = []


def announcement_in(configuration: dict[str, Any] | None) -> Announcement | None:
    """The announcement a `workers` row holds; None for a loading worker (or an older one)."""
    found = (configuration or {}).get(ANNOUNCEMENT_KEY)
    if found is None:
        return None
    try:
        return Announcement.model_validate(found)
    except ValidationError:
        return None
