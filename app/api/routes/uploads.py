"""`/v1/uploads`: OpenAI's Uploads API (a large file in parts).

Each `uow.run` is one committed transaction; bytes move between them, with none open.
"""

from functools import partial

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from app.api.body import json_post, read_json
from app.api.deps import PrincipalDep, SettingsDep, StorageDep, UnitOfWorkDep
from app.api.multipart import (
    missing_part,
    multipart_openapi,
    read_multipart,
)
from app.schemas.uploads import UploadComplete, UploadCreate, UploadObject, UploadPartObject
from app.services import uploads
from app.services.unrecorded_bytes import delete_unless_file, delete_unless_part

router = APIRouter(tags=["uploads"])

_PART_FORM = multipart_openapi({"data": {"type": "string", "format": "binary"}}, ["data"])


@json_post(router, "/uploads", UploadCreate)
async def create_upload(
    request: Request, principal: PrincipalDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> UploadObject:
    body = await read_json(request, UploadCreate)
    return await uow.run(uploads.create_upload, settings, principal.project_id, body)


@router.post("/uploads/{upload_id}/parts", openapi_extra=_PART_FORM)
async def add_upload_part(
    upload_id: str,
    request: Request,
    principal: PrincipalDep,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> UploadPartObject:
    """Add a part (multipart `data`, a file part or a text field), streamed to storage; a part
    that would take the upload past its declared `bytes` is refused as soon as it does."""
    intake = await uow.run(uploads.start_part, settings, storage, principal.project_id, upload_id)
    try:
        form = await read_multipart(
            request,
            stream_field="data",
            open_sink=lambda _part, _fields: intake.sink,
            limit=settings.size_limit("max_upload_part_bytes"),
        )
        if form.sink is None:
            raise missing_part("data")
    except BaseException:
        intake.sink.abort()
        raise
    stored = await run_in_threadpool(uploads.store_part, intake)
    return await uow.run_or_undo(
        partial(delete_unless_part, settings, storage, intake.part_id, stored.key),
        uploads.record_part,
        settings,
        principal.project_id,
        intake,
        stored,
    )


@json_post(router, "/uploads/{upload_id}/complete", UploadComplete)
async def complete_upload(
    upload_id: str,
    request: Request,
    principal: PrincipalDep,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> UploadObject:
    body = await read_json(request, UploadComplete)
    project_id = principal.project_id
    keys = await uow.run(uploads.parts_to_join, project_id, upload_id, body)
    joined = await run_in_threadpool(uploads.join_parts, storage, keys, body.md5)
    upload = await uow.run_or_undo(
        partial(delete_unless_file, settings, storage, joined[0], joined[1].key),
        uploads.record_completion,
        settings,
        project_id,
        upload_id,
        joined,
    )
    await run_in_threadpool(uploads.delete_parts, storage, upload_id)
    return upload


@router.post("/uploads/{upload_id}/cancel")
async def cancel_upload(
    upload_id: str, principal: PrincipalDep, uow: UnitOfWorkDep, storage: StorageDep
) -> UploadObject:
    upload = await uow.run(uploads.cancel_upload, principal.project_id, upload_id)
    await run_in_threadpool(uploads.delete_parts, storage, upload_id)
    return upload
