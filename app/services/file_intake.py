"""Receiving a client's file: streamed bytes under size limits, then a registered File.

`POST /files` streams into a `FileIntake`; `receive` commits the bytes with no transaction
open, `register_received` records them. The Uploads API reuses the limits and checks.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from pydantic import ValidationError
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.sizes import SizeLimit, too_large_message
from app.db.models import File
from app.errors import OpenAIError, validation_error
from app.ids import new_file_id
from app.schemas.admin import Quota
from app.schemas.files import UPLOAD_PURPOSES, FileCreateParams, FileObject
from app.services import quotas
from app.services.files import create_file_from_storage, file_storage_key, now, to_file_object
from app.storage import Storage, StoredObject, Writer

MAX_FILENAME_CHARS = 1024


def too_large(
    what: str, limit: SizeLimit, param: str, code: str = "file_too_large", size: int | None = None
) -> OpenAIError:
    return OpenAIError(
        too_large_message(what, limit, size),
        status_code=413,
        param=param,
        code=code,
    )


# Enough of a file's start to tell a JSONL batch file that came without a filename extension.
HEAD_BYTES = 256
_BOM = b"\xef\xbb\xbf"


class LimitedWriter:
    """A storage writer that refuses (413) to grow past `limit` bytes, as soon as it would."""

    def __init__(self, writer: Writer, limit: int, too_large: OpenAIError) -> None:
        self._writer = writer
        self._limit = limit
        self._too_large = too_large
        self._closed = False
        self.head = b""

    @property
    def key(self) -> str:
        return self._writer.key

    @property
    def bytes_written(self) -> int:
        return self._writer.bytes_written

    def write(self, data: bytes) -> None:
        if self._writer.bytes_written + len(data) > self._limit:
            raise self._too_large
        if len(self.head) < HEAD_BYTES:
            self.head += data[: HEAD_BYTES - len(self.head)]
        self._writer.write(data)

    def commit(self) -> StoredObject:
        self._closed = True
        return self._writer.commit()

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.abort()


def batch_file_too_large(settings: Settings, size: int | None = None) -> OpenAIError:
    limit = settings.size_limit("max_batch_file_bytes")
    return too_large("The Batch API input file", limit, "file", size=size)


def check_filename(filename: str | None, param: str = "file") -> str:
    """A filename is user data: any text, echoed back, but never used to build a path."""
    if not filename:
        raise OpenAIError(
            f"The '{param}' field must be a file upload with a filename "
            f"(e.g. curl -F {param}=@requests.jsonl).",
            param=param,
        )
    if len(filename) > MAX_FILENAME_CHARS:
        raise OpenAIError(
            f"The filename is too long: at most {MAX_FILENAME_CHARS} characters.", param=param
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in filename):
        raise OpenAIError("The filename must not contain control characters.", param=param)
    return filename


def check_batch_filename(
    filename: str, param: str | None = None, head: bytes | None = None
) -> None:
    """OpenAI's rule: a `.jsonl` name. A name without an extension (the SDK names raw bytes
    `upload`) passes too when `head`, the file's first bytes, opens a JSON object."""
    if filename.lower().endswith(".jsonl"):
        return
    if head is not None and not PurePosixPath(filename).suffix and _opens_object(head):
        return
    raise OpenAIError("Invalid file format for Batch API. Must be .jsonl", param=param)


def _opens_object(head: bytes) -> bool:
    return head.removeprefix(_BOM).lstrip().startswith(b"{")


class FileIntake:
    """The bytes of one `POST /files` on their way into storage.

    `open` is called once the file part's headers arrive, with the purpose if the
    client sent it first (the SDK does), so the batch rules apply while streaming.
    """

    def __init__(self, settings: Settings, storage: Storage) -> None:
        self.settings = settings
        self.storage = storage
        self.file_id = new_file_id()
        self.filename: str | None = None
        self.sink: LimitedWriter | None = None

    def open(self, filename: str | None, purpose: str | None) -> LimitedWriter:
        self.filename = check_filename(filename)
        limit = self.settings.max_file_bytes
        refusal = too_large("The file", self.settings.size_limit("max_file_bytes"), "file")
        if purpose == "batch":
            if PurePosixPath(self.filename).suffix:  # else the content decides, once it is in
                check_batch_filename(self.filename)
            limit, refusal = self.settings.max_batch_file_bytes, batch_file_too_large(self.settings)
        writer = self.storage.writer(file_storage_key(self.file_id))
        self.sink = LimitedWriter(writer, limit, refusal)
        return self.sink

    def abort(self) -> None:
        if self.sink is not None:
            self.sink.abort()


def check_purpose(purpose: object) -> None:
    """Clear messages for the purposes a client may upload with (see `FilePurpose`)."""
    if purpose == "evals":
        raise OpenAIError(
            "Purpose 'evals' is not supported by this server: OpenAI's File object cannot "
            "report it. Use 'user_data' instead.",
            param="purpose",
            code="invalid_value",
        )
    if isinstance(purpose, str) and purpose not in UPLOAD_PURPOSES:
        raise OpenAIError(
            f"Invalid 'purpose': {purpose!r} is not one of {', '.join(UPLOAD_PURPOSES)}.",
            param="purpose",
            code="invalid_value",
        )


def parse_create_params(fields: Mapping[str, Any]) -> FileCreateParams:
    """Validate the (bracket-nested) form fields of `POST /files`."""
    check_purpose(fields.get("purpose"))
    try:
        return FileCreateParams.model_validate(fields)
    except ValidationError as exc:
        raise validation_error(list(exc.errors())) from None


def register_client_file(
    session: Session,
    settings: Settings,
    *,
    project_id: str,
    file_id: str,
    filename: str,
    purpose: str,
    stored: StoredObject,
    expires_after_seconds: int | None,
) -> File:
    """Register a file a client sent, with OpenAI's default expiry.

    Batch files expire after 30 days (`batch_file_ttl_seconds`); others only when
    the client's `expires_after` says so.
    """
    created_at = now()
    if expires_after_seconds is not None:
        expires_at: int | None = created_at + expires_after_seconds
    elif purpose == "batch":
        expires_at = created_at + settings.batch_file_ttl_seconds
    else:
        expires_at = None
    return create_file_from_storage(
        session,
        project_id=project_id,
        filename=filename,
        purpose=purpose,
        stored=stored,
        expires_at=expires_at,
        file_id=file_id,
        created_at=created_at,
    )


@dataclass(frozen=True)
class ReceivedFile:
    """A `POST /files` whose bytes are committed to storage, not yet registered."""

    file_id: str
    filename: str
    params: FileCreateParams
    stored: StoredObject


def receive(settings: Settings, intake: FileIntake, fields: Mapping[str, Any]) -> ReceivedFile:
    """Check the form and commit the bytes (with no transaction open: a large fsync is slow)."""
    try:
        params = parse_create_params(fields)
        if intake.sink is None or intake.filename is None:
            raise OpenAIError("Missing required parameter: 'file'.", param="file")
        if params.purpose == "batch":
            check_batch_filename(intake.filename, head=intake.sink.head)
            if intake.sink.bytes_written > settings.max_batch_file_bytes:
                raise batch_file_too_large(settings, intake.sink.bytes_written)
        stored = intake.sink.commit()
    except BaseException:
        intake.abort()
        raise
    return ReceivedFile(intake.file_id, intake.filename, params, stored)


def register_received(
    session: Session, settings: Settings, project_id: str, received: ReceivedFile
) -> FileObject:
    params = received.params
    adding = {Quota.STORED_BYTES: received.stored.bytes, Quota.FILES: 1}
    quotas.check(session, settings, project_id, adding)
    row = register_client_file(
        session,
        settings,
        project_id=project_id,
        file_id=received.file_id,
        filename=received.filename,
        purpose=params.purpose,
        stored=received.stored,
        expires_after_seconds=params.expires_after.seconds if params.expires_after else None,
    )
    return to_file_object(row)
