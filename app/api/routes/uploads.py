"""`/v1/uploads`: OpenAI's Uploads API (a large file in parts).

Each `uow.run` is one committed transaction; bytes move between them, with none open.
"""

from dataclasses import dataclass
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from starlette.concurrency import run_in_threadpool

from app.api.body import json_post, read_json
from app.api.deps import PrincipalDep, SettingsDep, StorageDep, UnitOfWorkDep
from app.api.multipart import (
    missing_part,
    multipart_openapi,
    read_multipart,
)
from app.api.unit_of_work import UnitOfWork
from app.config import Settings
from app.schemas.uploads import UploadComplete, UploadCreate, UploadObject, UploadPartObject
from app.services import uploads
from app.services.unrecorded_bytes import delete_unless_file, delete_unless_part
from app.storage import Storage

router = APIRouter(tags=["uploads"])

_PART_FORM = multipart_openapi({"data": {"type": "string", "format": "binary"}}, ["data"])


@dataclass(frozen=True)
class UploadStep:
    """What adding a part and completing an upload take: both move bytes and record them."""

    request: Request
    project_id: str
    uow: UnitOfWork
    settings: Settings
    storage: Storage


async def get_upload_step(
    request: Request,
    principal: PrincipalDep,
    uow: UnitOfWorkDep,
    settings: SettingsDep,
    storage: StorageDep,
) -> UploadStep:
    return UploadStep(request, principal.project_id, uow, settings, storage)


UploadStepDep = Annotated[UploadStep, Depends(get_upload_step)]


@json_post(router, "/uploads", UploadCreate)
async def create_upload(
    request: Request, principal: PrincipalDep, uow: UnitOfWorkDep, settings: SettingsDep
) -> UploadObject:
    body = await read_json(request, UploadCreate)
    return await uow.run(uploads.create_upload, settings, principal.project_id, body)


@router.post("/uploads/{upload_id}/parts", openapi_extra=_PART_FORM)
async def add_upload_part(upload_id: str, step: UploadStepDep) -> UploadPartObject:
    """Add a part (multipart `data`, a file part or a text field), streamed to storage; a part
    that would take the upload past its declared `bytes` is refused as soon as it does."""
    uow, settings, storage = step.uow, step.settings, step.storage
    intake = await uow.run(uploads.start_part, settings, storage, step.project_id, upload_id)
    try:
        form = await read_multipart(
            step.request,
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
        step.project_id,
        intake,
        stored,
    )


@json_post(router, "/uploads/{upload_id}/complete", UploadComplete)
async def complete_upload(upload_id: str, step: UploadStepDep) -> UploadObject:
    uow, settings, storage, project_id = step.uow, step.settings, step.storage, step.project_id
    body = await read_json(step.request, UploadComplete)
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
