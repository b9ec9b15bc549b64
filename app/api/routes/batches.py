"""`/v1/batches`: create, retrieve, list and cancel, as OpenAI's Batch API."""

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.concurrency import run_in_threadpool

from app.api.body import json_body_openapi, read_json
from app.api.deps import PrincipalDep, SessionDep, SettingsDep
from app.schemas.batches import BatchObject, CreateBatchRequest
from app.schemas.common import ListObject
from app.services import batches
from app.services.housekeeping import FINALISATION, VALIDATION, wake

router = APIRouter(tags=["batches"])


@router.post(
    "/batches", response_model=BatchObject, openapi_extra=json_body_openapi(CreateBatchRequest)
)
async def create_batch(
    request: Request, session: SessionDep, settings: SettingsDep, principal: PrincipalDep
) -> BatchObject:
    params = await read_json(request, CreateBatchRequest)
    batch = await run_in_threadpool(
        batches.create_batch, session, settings, principal.project_id, params
    )
    wake(settings, VALIDATION)  # validation starts now, not at the next housekeeping tick
    return batch


@router.get("/batches", response_model=ListObject[BatchObject])
def list_batches(
    session: SessionDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query()] = batches.DEFAULT_LIST_LIMIT,
) -> ListObject[BatchObject]:
    return batches.list_batches(session, principal.project_id, after, limit)


@router.get("/batches/{batch_id}", response_model=BatchObject)
def retrieve_batch(batch_id: str, session: SessionDep, principal: PrincipalDep) -> BatchObject:
    return batches.get_batch(session, principal.project_id, batch_id)


@router.post("/batches/{batch_id}/cancel", response_model=BatchObject)
def cancel_batch(
    batch_id: str, session: SessionDep, settings: SettingsDep, principal: PrincipalDep
) -> BatchObject:
    batch = batches.cancel_batch(session, principal.project_id, batch_id)
    wake(
        settings, FINALISATION
    )  # with no worker holding a shard, the batch ends `cancelled` at once
    return batch
