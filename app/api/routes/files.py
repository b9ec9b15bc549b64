"""`/v1/files`: OpenAI's Files API. Each `uow.run` is one committed transaction."""

from functools import partial

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.api.deps import PrincipalDep, SettingsDep, StorageDep, UnitOfWorkDep
from app.api.multipart import (
    missing_part,
    multipart_openapi,
    nest_brackets,
    read_multipart,
)
from app.schemas.common import ListObject, SortOrder
from app.schemas.files import UPLOAD_PURPOSES, FileDeleted, FileObject
from app.services import file_expiry, file_intake, files
from app.services.unrecorded_bytes import delete_unless_file

router = APIRouter(tags=["files"])

_UPLOAD_FORM = multipart_openapi(
    {
        "file": {"type": "string", "format": "binary"},
        "purpose": {"type": "string", "enum": list(UPLOAD_PURPOSES)},
        "expires_after[anchor]": {"type": "string", "enum": ["created_at"]},
        "expires_after[seconds]": {"type": "integer", "minimum": 3600, "maximum": 2592000},
    },
    required=["file", "purpose"],
)


@router.post("/files", openapi_extra=_UPLOAD_FORM)
async def create_file(
    request: Request,
    principal: PrincipalDep,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> FileObject:
    """Upload a file (multipart: `file`, `purpose`, optional `expires_after[…]`), streamed."""
    intake = file_intake.FileIntake(settings, storage)
    try:
        form = await read_multipart(
            request,
            stream_field="file",
            open_sink=lambda part, fields: intake.open(part.filename, fields.get("purpose")),
            limit=settings.size_limit("max_file_bytes"),
        )
        if form.sink is None:
            raise missing_part("file")
        fields = nest_brackets(form.fields)
    except BaseException:
        intake.abort()
        raise
    received = await run_in_threadpool(file_intake.receive, settings, intake, fields)
    return await uow.run_or_undo(
        partial(delete_unless_file, settings, storage, received.file_id, received.stored.key),
        file_intake.register_received,
        settings,
        principal.project_id,
        received,
    )


@router.get("/files")
async def list_files(
    principal: PrincipalDep,
    uow: UnitOfWorkDep,
    purpose: str | None = None,
    limit: int = files.MAX_LIST_LIMIT,
    order: SortOrder = "desc",
    after: str | None = None,
) -> ListObject[FileObject]:
    return await uow.run(
        files.list_files,
        principal.project_id,
        purpose=purpose,
        limit=limit,
        order=order,
        after=after,
    )


@router.get("/files/{file_id}")
async def retrieve_file(file_id: str, principal: PrincipalDep, uow: UnitOfWorkDep) -> FileObject:
    return await uow.run(files.retrieve_file, principal.project_id, file_id)


@router.get(
    "/files/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
async def download_file(
    file_id: str,
    principal: PrincipalDep,
    uow: UnitOfWorkDep,
    storage: StorageDep,
) -> StreamingResponse:
    """The raw bytes, streamed; no transaction stays open while they are sent."""
    row, chunks = await uow.run(files.open_file_content, storage, principal.project_id, file_id)
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(row.bytes)},
    )


@router.delete("/files/{file_id}")
async def delete_file(
    file_id: str, principal: PrincipalDep, uow: UnitOfWorkDep, storage: StorageDep
) -> FileDeleted:
    deleted = await uow.run(file_expiry.delete_file, principal.project_id, file_id)
    await uow.run(file_expiry.reclaim_deleted, storage, file_id)
    return deleted
