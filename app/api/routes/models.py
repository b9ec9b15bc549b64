"""`/v1/models`: the models this deployment serves (`app.services.served_models`)."""

from fastapi import APIRouter

from app.api.deps import PrincipalDep, SettingsDep, UnitOfWorkDep
from app.errors import OpenAIError
from app.schemas.models import ModelList, ModelObject
from app.services import served_models

router = APIRouter(tags=["models"])


# A base model has no `parent` or `root` (vLLM sends nulls): they are left out.
@router.get("/models", response_model=ModelList, response_model_exclude_none=True)
async def list_models(
    uow: UnitOfWorkDep, settings: SettingsDep, _principal: PrincipalDep
) -> ModelList:
    return ModelList(data=await uow.run(served_models.model_objects, settings))


@router.get("/models/{model:path}", response_model=ModelObject, response_model_exclude_none=True)
async def retrieve_model(
    model: str, uow: UnitOfWorkDep, settings: SettingsDep, _principal: PrincipalDep
) -> ModelObject:
    found = await uow.run(served_models.model_object, settings, model)
    if found is None:
        raise OpenAIError(
            f"The model '{model}' does not exist or you do not have access to it.",
            status_code=404,
            param="model",
            code="model_not_found",
        )
    return found
