"""`/v1/batches`: create, retrieve, list and cancel, as OpenAI's Batch API; retry is ours.

Each `uow.run` is one committed transaction.
"""

from typing import Annotated

from fastapi import APIRouter, Query, Request

from app.api.body import json_post, read_json
from app.api.deps import PrincipalDep, SettingsDep, StorageDep, UnitOfWorkDep
from app.api.partial_results import results_page
from app.api.retry import run_retry
from app.schemas.admin import ScheduledBatchObject
from app.schemas.batches import (
    BatchObject,
    BatchResultsPage,
    CreateBatchRequest,
    RetryBatchRequest,
)
from app.schemas.common import ListObject
from app.services import batches, partial_results, schedule
from app.services.housekeeping import FINALIZATION, VALIDATION, wake

router = APIRouter(tags=["batches"])


@json_post(router, "/batches", CreateBatchRequest, response_model=BatchObject)
async def create_batch(
    request: Request, uow: UnitOfWorkDep, settings: SettingsDep, principal: PrincipalDep
) -> BatchObject:
    params = await read_json(request, CreateBatchRequest)
    batch = await uow.run(batches.create_batch, settings, principal.project_id, params)
    wake(settings, VALIDATION)  # validation starts now, not at the next housekeeping tick
    return batch


@router.get("/batches", response_model=ListObject[BatchObject])
async def list_batches(
    uow: UnitOfWorkDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query()] = batches.DEFAULT_LIST_LIMIT,
) -> ListObject[BatchObject]:
    return await uow.run(batches.list_batches, principal.project_id, after, limit)


@router.get("/batches/{batch_id}", response_model=BatchObject)
async def retrieve_batch(batch_id: str, uow: UnitOfWorkDep, principal: PrincipalDep) -> BatchObject:
    return await uow.run(batches.get_batch, principal.project_id, batch_id)


@router.get(
    "/batches/{batch_id}/schedule",
    response_model=ScheduledBatchObject,
    operation_id="retrieveBatchSchedule",
)
async def retrieve_batch_schedule(
    batch_id: str, uow: UnitOfWorkDep, principal: PrincipalDep
) -> ScheduledBatchObject:
    """Ours: the batch's place in the schedule, its estimated start and finish, and whether
    it is at risk of expiring (not a field of OpenAI's Batch object)."""
    scope = None if principal.is_admin else principal.project_id
    return await uow.run(schedule.scheduled_batch, batch_id, scope)


@router.get(
    "/batches/{batch_id}/results", response_model=BatchResultsPage, operation_id="listBatchResults"
)
async def list_batch_results(
    batch_id: str,
    uow: UnitOfWorkDep,
    storage: StorageDep,
    principal: PrincipalDep,
    after: str | None = None,
    limit: Annotated[int, Query()] = partial_results.DEFAULT_LIMIT,
) -> BatchResultsPage:
    """Ours: the result lines recorded so far, while the batch runs (`complete: false`) and
    from its files once it ended; follow with `after=<last_id>`."""
    scope = None if principal.is_admin else principal.project_id
    page = await results_page(uow, storage, scope, batch_id, None, after, limit)
    return BatchResultsPage(
        data=page.lines,
        has_more=page.has_more,
        last_id=page.cursor,
        complete=page.complete,
        restarted=page.restarted,
    )


@router.post("/batches/{batch_id}/cancel", response_model=BatchObject)
async def cancel_batch(
    batch_id: str, uow: UnitOfWorkDep, settings: SettingsDep, principal: PrincipalDep
) -> BatchObject:
    batch = await uow.run(batches.cancel_batch, principal.project_id, batch_id)
    # With no worker holding a shard, the batch ends `cancelled` at once.
    wake(settings, FINALIZATION)
    return batch


@json_post(
    router,
    "/batches/{batch_id}/retry",
    RetryBatchRequest,
    response_model=BatchObject,
    operation_id="retryBatch",
)
async def retry_batch(
    batch_id: str,
    request: Request,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
    principal: PrincipalDep,
) -> BatchObject:
    """Ours: a new batch of this finished batch's requests that failed in a way a retry can
    change (never run, or 5xx; with `all`, every failed one). Its metadata has `retry_of`."""
    params = await read_json(request, RetryBatchRequest)
    scope = None if principal.is_admin else principal.project_id
    return await run_retry(uow, settings, storage, scope, batch_id, params.all)
