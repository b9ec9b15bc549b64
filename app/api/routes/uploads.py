"""`/v1/uploads`: OpenAI's Uploads API (a large file in parts)."""

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from app.api.body import json_body_openapi, read_json
from app.api.deps import PrincipalDep, SessionDep, SettingsDep, StorageDep
from app.api.multipart import (
    FORM_OVERHEAD_BYTES,
    missing_part,
    multipart_openapi,
    read_multipart,
)
from app.api.transaction import in_transaction
from app.schemas.uploads import UploadComplete, UploadCreate, UploadObject, UploadPartObject
from app.services import uploads

router = APIRouter(tags=["uploads"])

_PART_FORM = multipart_openapi({"data": {"type": "string", "format": "binary"}}, ["data"])


@router.post("/uploads", openapi_extra=json_body_openapi(UploadCreate))
async def create_upload(
    request: Request, principal: PrincipalDep, session: SessionDep, settings: SettingsDep
) -> UploadObject:
    body = await read_json(request, UploadCreate)
    return await in_transaction(
        session, uploads.create_upload, settings, principal.project_id, body
    )


@router.post("/uploads/{upload_id}/parts", openapi_extra=_PART_FORM)
async def add_upload_part(
    upload_id: str,
    request: Request,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> UploadPartObject:
    """Add a part (multipart `data`, a file part or a text field), streamed to storage."""
    intake = await in_transaction(
        session, uploads.start_part, settings, storage, principal.project_id, upload_id
    )
    try:
        form = await read_multipart(
            request,
            stream_field="data",
            open_sink=lambda _part, _fields: intake.sink,
            max_body=settings.max_upload_part_bytes + FORM_OVERHEAD_BYTES,
        )
        if form.sink is None:
            raise missing_part("data")
    except BaseException:
        intake.sink.abort()
        raise
    return await run_in_threadpool(uploads.add_part, session, storage, principal.project_id, intake)


@router.post("/uploads/{upload_id}/complete", openapi_extra=json_body_openapi(UploadComplete))
async def complete_upload(
    upload_id: str,
    request: Request,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> UploadObject:
    body = await read_json(request, UploadComplete)
    return await run_in_threadpool(
        uploads.complete_upload, session, settings, storage, principal.project_id, upload_id, body
    )


@router.post("/uploads/{upload_id}/cancel")
def cancel_upload(
    upload_id: str, principal: PrincipalDep, session: SessionDep, storage: StorageDep
) -> UploadObject:
    return uploads.cancel_upload(session, storage, principal.project_id, upload_id)
