"""Wire shapes of `/v1/models` (`openai.types.Model`)."""

from typing import Literal

from pydantic import BaseModel


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "overnight"
    # Ours (vLLM's server adds fields too): the batch endpoints this model serves.
    endpoints: list[str]


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]
