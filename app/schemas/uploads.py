"""Uploads API wire shapes, with OpenAI's names and enums."""

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from app.schemas.common import ExpiresAfter, RequestModel, inline_enum
from app.schemas.files import FileObject


class UploadStatus(StrEnum):
    PENDING = "pending"
    COMPLETED = "completed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


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
    status: Annotated[UploadStatus, inline_enum(UploadStatus, "Status")]
    file: FileObject | None = None


class UploadPartObject(BaseModel):
    id: str
    object: Literal["upload.part"] = "upload.part"
    created_at: int
    upload_id: str
