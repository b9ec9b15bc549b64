"""Files API wire shapes, with OpenAI's names and enums."""

from enum import StrEnum
from typing import Annotated, Literal, get_args

from pydantic import BaseModel

from app.schemas.common import DeletedObject, ExpiresAfter, RequestModel, inline_enum

# What a client may upload. OpenAI also accepts `evals`, but its File object cannot
# report that purpose (the SDK's response Literal lacks it), so it is refused.
FilePurpose = Literal["assistants", "batch", "fine-tune", "vision", "user_data"]


# What a File object may say: uploads plus the purposes of files the server writes.
class FileObjectPurpose(StrEnum):
    ASSISTANTS = "assistants"
    ASSISTANTS_OUTPUT = "assistants_output"
    BATCH = "batch"
    BATCH_OUTPUT = "batch_output"
    FINE_TUNE = "fine-tune"
    FINE_TUNE_RESULTS = "fine-tune-results"
    VISION = "vision"
    USER_DATA = "user_data"


class FileStatus(StrEnum):
    UPLOADED = "uploaded"
    PROCESSED = "processed"
    ERROR = "error"


UPLOAD_PURPOSES: tuple[str, ...] = get_args(FilePurpose)
# OpenAI refuses to hand back the content of these.
UNDOWNLOADABLE_PURPOSES = ("assistants", "user_data")


class FileCreateParams(RequestModel):
    """The form fields of `POST /files`, once bracketed names are nested."""

    purpose: FilePurpose
    expires_after: ExpiresAfter | None = None


class FileObject(BaseModel):
    """OpenAI's `OpenAIFile`. `status` is deprecated but the SDK requires it: always sent."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: Annotated[FileObjectPurpose, inline_enum(FileObjectPurpose, "Purpose")]
    status: Annotated[FileStatus, inline_enum(FileStatus, "Status")] = FileStatus.PROCESSED
    expires_at: int | None = None
    status_details: str | None = None


class FileDeleted(DeletedObject):
    object: Literal["file"] = "file"
