"""`/v1/files`: OpenAI's Files API."""

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app.api.deps import PrincipalDep, SessionDep, SettingsDep, StorageDep
from app.api.multipart import (
    FORM_OVERHEAD_BYTES,
    missing_part,
    multipart_openapi,
    nest_brackets,
    read_multipart,
)
from app.schemas.common import ListObject, Order
from app.schemas.files import UPLOAD_PURPOSES, FileDeleted, FileObject
from app.services import files

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
    session: SessionDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> FileObject:
    """Upload a file (multipart: `file`, `purpose`, optional `expires_after[…]`), streamed."""
    intake = files.FileIntake(settings, storage)
    try:
        form = await read_multipart(
            request,
            stream_field="file",
            open_sink=lambda part, fields: intake.open(part.filename, fields.get("purpose")),
            max_body=settings.max_file_bytes + FORM_OVERHEAD_BYTES,
        )
        if form.sink is None:
            raise missing_part("file")
        fields = nest_brackets(form.fields)
    except BaseException:
        intake.abort()
        raise
    return await run_in_threadpool(
        files.create_file, session, settings, principal.project_id, intake, fields
    )


@router.get("/files")
def list_files(
    principal: PrincipalDep,
    session: SessionDep,
    purpose: str | None = None,
    limit: int = files.MAX_LIST_LIMIT,
    order: Order = "desc",
    after: str | None = None,
) -> ListObject[FileObject]:
    with session.begin():
        return files.list_files(
            session, principal.project_id, purpose=purpose, limit=limit, order=order, after=after
        )


@router.get("/files/{file_id}")
def retrieve_file(file_id: str, principal: PrincipalDep, session: SessionDep) -> FileObject:
    with session.begin():
        return files.to_file_object(files.get_file(session, principal.project_id, file_id))


@router.get(
    "/files/{file_id}/content",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/octet-stream": {}}}},
)
def download_file(
    file_id: str,
    principal: PrincipalDep,
    session: SessionDep,
    storage: StorageDep,
) -> StreamingResponse:
    """The raw bytes, streamed; no transaction stays open while they are sent."""
    with session.begin():
        row, chunks = files.open_file_content(session, storage, principal.project_id, file_id)
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(row.bytes)},
    )


@router.delete("/files/{file_id}")
def delete_file(
    file_id: str, principal: PrincipalDep, session: SessionDep, storage: StorageDep
) -> FileDeleted:
    return files.delete_file(session, storage, principal.project_id, file_id)
