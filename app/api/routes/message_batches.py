"""`/v1/messages/batches`: Anthropic's Message Batches API, on overnight's batches.

Callers authenticate with `x-api-key` (or `Authorization: Bearer`) and overnight's keys;
`anthropic-version` is accepted and ignored. Errors on these routes are Anthropic's:
`{"type": "error", "error": {"type", "message"}}`.
"""

import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool

from app.api.body import json_post, read_json
from app.api.deps import SettingsDep, StorageDep, UnitOfWorkDep, get_principal
from app.api.partial_results import results_page
from app.core.states import BatchApi
from app.errors import OpenAIError, validation_error
from app.schemas.message_batches import (
    DEFAULT_LIST_LIMIT,
    MAX_LIST_LIMIT,
    CreateMessageBatchRequest,
    DeletedMessageBatch,
    MessageBatch,
    MessageBatchPage,
    anthropic_error,
)
from app.services import message_batch_results as results
from app.services import message_batches, partial_results
from app.services.auth import Principal
from app.services.housekeeping import FINALIZATION, VALIDATION, wake
from app.services.unrecorded_bytes import delete_unless_file

log = logging.getLogger("overnight.api")

COMPLETE_HEADER = "overnight-results-complete"
MAX_PAGE = partial_results.MAX_LIMIT


def _error(status_code: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(anthropic_error(status_code, message), status_code, headers=headers)


class AnthropicErrorsRoute(APIRoute):
    """Answers this router's failures (authentication and validation too) in Anthropic's
    error shape; the rest of the API keeps OpenAI's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def handle(request: Request) -> Response:
            try:
                return await handler(request)
            except OpenAIError as exc:
                return _error(exc.status_code, exc.message, exc.headers)
            except RequestValidationError as exc:
                return _error(400, validation_error(list(exc.errors())).message)
            except Exception:
                log.exception("%s %s failed", request.method, request.url.path)
                return _error(500, "The server had an error while processing your request.")

        return handle


router = APIRouter(tags=["message-batches"], route_class=AnthropicErrorsRoute)


async def anthropic_principal(
    request: Request,
    x_api_key: Annotated[str | None, Header()] = None,
    authorization: Annotated[str | None, Header()] = None,
) -> Principal:
    """The caller by `x-api-key` (Anthropic's header) or else `Authorization: Bearer`."""
    if x_api_key:
        authorization = f"Bearer {x_api_key}"
    return await get_principal(request, authorization)


AnthropicPrincipalDep = Annotated[Principal, Depends(anthropic_principal)]


def _base_url(request: Request) -> str:
    return str(request.base_url)


@json_post(router, "/messages/batches", CreateMessageBatchRequest, response_model=MessageBatch)
async def create_message_batch(
    request: Request,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
    principal: AnthropicPrincipalDep,
) -> MessageBatch:
    # The inline requests become the batch's input file: the body may be as large as one.
    params = await read_json(request, CreateMessageBatchRequest, "max_batch_file_bytes")
    await run_in_threadpool(message_batches.check_requests, settings, params.requests)
    file_id, stored = await run_in_threadpool(
        message_batches.write_input, settings, storage, params.requests
    )
    batch = await uow.run_or_undo(
        partial(delete_unless_file, settings, storage, file_id, stored.key),
        message_batches.create,
        settings,
        principal.project_id,
        (file_id, stored),
        len(params.requests),
        _base_url(request),
    )
    wake(settings, VALIDATION)
    return batch


@router.get("/messages/batches", response_model=MessageBatchPage)
async def list_message_batches(
    request: Request,
    uow: UnitOfWorkDep,
    principal: AnthropicPrincipalDep,
    before_id: str | None = None,
    after_id: str | None = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIST_LIMIT)] = DEFAULT_LIST_LIMIT,
) -> MessageBatchPage:
    return await uow.run(
        message_batches.list_page,
        principal.project_id,
        _base_url(request),
        before_id=before_id,
        after_id=after_id,
        limit=limit,
    )


@router.get("/messages/batches/{message_batch_id}", response_model=MessageBatch)
async def retrieve_message_batch(
    message_batch_id: str, request: Request, uow: UnitOfWorkDep, principal: AnthropicPrincipalDep
) -> MessageBatch:
    return await uow.run(
        message_batches.retrieve, principal.project_id, message_batch_id, _base_url(request)
    )


@router.post("/messages/batches/{message_batch_id}/cancel", response_model=MessageBatch)
async def cancel_message_batch(
    message_batch_id: str,
    request: Request,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    principal: AnthropicPrincipalDep,
) -> MessageBatch:
    batch = await uow.run(
        message_batches.cancel, principal.project_id, message_batch_id, _base_url(request)
    )
    wake(settings, FINALIZATION)  # with no worker holding a shard, it ends at once
    return batch


@router.delete("/messages/batches/{message_batch_id}", response_model=DeletedMessageBatch)
async def delete_message_batch(
    message_batch_id: str, uow: UnitOfWorkDep, storage: StorageDep, principal: AnthropicPrincipalDep
) -> DeletedMessageBatch:
    deleted, chunk_keys = await uow.run(
        message_batches.delete_ended, principal.project_id, message_batch_id
    )
    for key in chunk_keys:
        await run_in_threadpool(storage.delete, key)
    return deleted


@router.get(
    "/messages/batches/{message_batch_id}/results",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-jsonl": {}}}},
)
async def message_batch_results(
    message_batch_id: str,
    uow: UnitOfWorkDep,
    storage: StorageDep,
    principal: AnthropicPrincipalDep,
    after: str | None = None,
    limit: int | None = None,
) -> Response:
    """The results JSONL, streamed; no transaction stays open while it is sent.

    Ours: while the batch runs, or given `after`/`limit`, a page of the results so far,
    marked by the `overnight-results-*` headers (`partial_results`)."""
    scope = None if principal.is_admin else principal.project_id
    paged = after is not None or limit is not None
    api = BatchApi.ANTHROPIC
    if not paged and await uow.run(partial_results.has_ended, scope, message_batch_id, api):
        source = await uow.run(results.open_results, principal.project_id, message_batch_id)
        return StreamingResponse(
            results.result_lines(storage, source),
            media_type="application/x-jsonl",
            headers={COMPLETE_HEADER: "true"},
        )
    page = await results_page(uow, storage, scope, message_batch_id, api, after, limit or MAX_PAGE)
    return Response(
        partial_results.as_message_results(page),
        media_type="application/x-jsonl",
        headers={
            COMPLETE_HEADER: str(page.complete).lower(),
            "overnight-results-cursor": page.cursor,
            "overnight-results-has-more": str(page.has_more).lower(),
            "overnight-results-restarted": str(page.restarted).lower(),
        },
    )
