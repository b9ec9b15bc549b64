"""Wire shapes of `/v1/models` (`openai.types.Model`), and what a worker announces it serves."""

from typing import Any, Literal

from pydantic import BaseModel, ValidationError

# Where a worker's announcement sits in its `workers` row's `engine_configuration`.
ANNOUNCEMENT_KEY = "served"


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


class Announcement(BaseModel):
    """What a ready worker serves: its served names and the endpoints vLLM built for its model,
    and the LoRA adapters of that model a line may name instead."""

    names: list[str]
    endpoints: list[str]
    adapters: list[AnnouncedAdapter] = []


def announcement_in(configuration: dict[str, Any] | None) -> Announcement | None:
    """The announcement a `workers` row holds; None for a loading worker (or an older one)."""
    found = (configuration or {}).get(ANNOUNCEMENT_KEY)
    if found is None:
        return None
    try:
        return Announcement.model_validate(found)
    except ValidationError:
        return None
