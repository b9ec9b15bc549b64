"""`/v1/models`: the models this deployment serves (the registry in settings)."""

import time

from fastapi import APIRouter

from app.api.deps import PrincipalDep, SettingsDep
from app.config import Settings
from app.errors import OpenAIError
from app.schemas.models import ModelList, ModelObject

router = APIRouter(tags=["models"])

# Models are configuration, not objects with a history: they exist since this process started.
_STARTED_AT = int(time.time())


def _models(settings: Settings) -> list[ModelObject]:
    return [
        ModelObject(id=m.name, created=_STARTED_AT, endpoints=m.endpoints) for m in settings.models
    ]


@router.get("/models", response_model=ModelList)
def list_models(settings: SettingsDep, _principal: PrincipalDep) -> ModelList:
    return ModelList(data=_models(settings))


@router.get("/models/{model:path}", response_model=ModelObject)
def retrieve_model(model: str, settings: SettingsDep, _principal: PrincipalDep) -> ModelObject:
    found = next((m for m in _models(settings) if m.id == model), None)
    if found is None:
        raise OpenAIError(
            f"The model '{model}' does not exist or you do not have access to it.",
            status_code=404,
            param="model",
            code="model_not_found",
        )
    return found
