"""Wire shapes of `/v1/models` (`openai.types.Model`)."""

from typing import Literal

from pydantic import BaseModel


class ModelObject(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "overnight"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelObject]
