"""Uploads API wire shapes, with OpenAI's names and enums."""

from typing import Literal

from pydantic import BaseModel, Field

from app.schemas.common import ExpiresAfter, RequestModel
from app.schemas.files import FileObject

UploadStatus = Literal["pending", "completed", "cancelled", "expired"]


class UploadCreate(RequestModel):
    filename: str
    # Checked by the service, for the same messages as `POST /files`.
    purpose: str
    bytes: int = Field(ge=0)
    mime_type: str = Field(max_length=256)
    expires_after: ExpiresAfter | None = None


class UploadComplete(RequestModel):
    part_ids: list[str]
    md5: str | None = None


class UploadObject(BaseModel):
    """OpenAI's `Upload`; `file` stays null until the upload is completed."""

    id: str
    object: Literal["upload"] = "upload"
    bytes: int
    created_at: int
    expires_at: int
    filename: str
    purpose: str
    status: UploadStatus
    file: FileObject | None = None


class UploadPartObject(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
