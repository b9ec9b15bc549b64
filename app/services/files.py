"""Files: receive, register, list, serve, delete and expire stored files, per project.

A file's bytes live in storage under `files/{file_id}` (never under its name); its
row says who owns it and when it stops being visible. Deleted and expired files
vanish from the API at once; their bytes are reclaimed as soon as no running batch
reads them.
"""

import itertools
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, exists, or_, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES
from app.db.models import Batch, File
from app.errors import OpenAIError, not_found, validation_error
from app.ids import new_file_id
from app.schemas.common import ListObject, Order
from app.schemas.files import (
    UNDOWNLOADABLE_PURPOSES,
    UPLOAD_PURPOSES,
    FileCreateParams,
    FileDeleted,
    FileObject,
    FileStatus,
)
from app.services.pagination import check_limit, paginate
from app.storage import Storage, StoredObject, Writer

MAX_LIST_LIMIT = 10_000
MAX_FILENAME_CHARS = 1024
# Rows handled per housekeeping call, so that one call stays a short transaction.
SWEEP_LIMIT = 1000


def file_storage_key(file_id: str) -> str:
    return f"files/{file_id}"


def _now() -> int:
    return int(time.time())


# --- receiving bytes ---------------------------------------------------------------------


def too_large(what: str, limit: int, param: str, code: str = "file_too_large") -> OpenAIError:
    return OpenAIError(
        f"{what} is too large: at most {limit} bytes are allowed.",
        status_code=413,
        param=param,
        code=code,
    )


class LimitedWriter:
    """A storage writer that refuses (413) to grow past `limit` bytes, as soon as it would."""

    def __init__(self, writer: Writer, limit: int, too_large: OpenAIError) -> None:
        self._writer = writer
        self._limit = limit
        self._too_large = too_large
        self._closed = False

    @property
    def key(self) -> str:
        return self._writer.key

    @property
    def bytes_written(self) -> int:
        return self._writer.bytes_written

    def write(self, data: bytes) -> None:
        if self._writer.bytes_written + len(data) > self._limit:
            raise self._too_large
        self._writer.write(data)

    def commit(self) -> StoredObject:
        self._closed = True
        return self._writer.commit()

    def abort(self) -> None:
        if not self._closed:
            self._closed = True
            self._writer.abort()


def batch_file_too_large(settings: Settings) -> OpenAIError:
    return too_large("A Batch API input file", settings.max_batch_file_bytes, "file")


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


def check_batch_filename(filename: str, param: str | None = None) -> None:
    if not filename.lower().endswith(".jsonl"):
        raise OpenAIError("Invalid file format for Batch API. Must be .jsonl", param=param)


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
        refusal = too_large("File", limit, "file")
        if purpose == "batch":
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
    created_at = _now()
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
            check_batch_filename(intake.filename)
            if intake.sink.bytes_written > settings.max_batch_file_bytes:
                raise batch_file_too_large(settings)
        stored = intake.sink.commit()
    except BaseException:
        intake.abort()
        raise
    return ReceivedFile(intake.file_id, intake.filename, params, stored)


def register_received(
    session: Session, settings: Settings, project_id: str, received: ReceivedFile
) -> FileObject:
    params = received.params
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


# --- registering and finding -------------------------------------------------------------


def create_file_from_storage(
    session: Session,
    *,
    project_id: str,
    filename: str,
    purpose: str,
    stored: StoredObject,
    expires_at: int | None,
    file_id: str | None = None,
    created_at: int | None = None,
) -> File:
    """Register an object already committed to storage as a File of `project_id`.

    For server-written files (batch outputs: `purpose="batch_output"`), write them
    with `storage.writer(file_storage_key(file_id))` and pass the same `file_id`.
    Runs in the caller's transaction.
    """
    row = File(
        id=file_id or new_file_id(),
        project_id=project_id,
        filename=filename,
        purpose=purpose,
        bytes=stored.bytes,
        sha256=stored.sha256,
        storage_key=stored.key,
        status=FileStatus.PROCESSED,
        created_at=created_at if created_at is not None else _now(),
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return row


def _visible(now: int) -> list[ColumnElement[bool]]:
    return [File.deleted_at.is_(None), or_(File.expires_at.is_(None), File.expires_at > now)]


def get_file(session: Session, project_id: str, file_id: str, *, param: str = "id") -> File:
    """The project's live File `file_id`, or OpenAI's 404 (also for other projects' files)."""
    row = session.scalar(
        select(File).where(File.id == file_id, File.project_id == project_id, *_visible(_now()))
    )
    if row is None:
        raise not_found("File", file_id, param=param)
    return row


def retrieve_file(session: Session, project_id: str, file_id: str) -> FileObject:
    return to_file_object(get_file(session, project_id, file_id))


def to_file_object(row: File) -> FileObject:
    return FileObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        filename=row.filename,
        purpose=row.purpose,
        status=row.status,
        expires_at=row.expires_at,
    )


def list_files(
    session: Session,
    project_id: str,
    *,
    purpose: str | None,
    limit: int,
    order: Order,
    after: str | None,
) -> ListObject[FileObject]:
    check_limit(limit, MAX_LIST_LIMIT)
    visible = _visible(_now())
    if purpose is not None:
        visible.append(File.purpose == purpose)
    page = paginate(
        session,
        File,
        scope=[File.project_id == project_id],
        visible=visible,
        after=after,
        limit=limit,
        order=order,
    )
    return ListObject[FileObject].of([to_file_object(r) for r in page.rows], page.has_more)


def open_file_content(
    session: Session, storage: Storage, project_id: str, file_id: str
) -> tuple[File, Iterator[bytes]]:
    """The File and a stream of its bytes, already opened, so a later delete cannot cut it."""
    row = get_file(session, project_id, file_id)
    if row.purpose in UNDOWNLOADABLE_PURPOSES:
        raise OpenAIError(f"Not allowed to download files of purpose: {row.purpose}")
    chunks = storage.read(row.storage_key)
    try:
        first = next(chunks, None)
    except FileNotFoundError:
        raise not_found("File", file_id) from None
    return row, itertools.chain(() if first is None else (first,), chunks)


# --- deleting and expiring ---------------------------------------------------------------


def _not_read_by_running_batch() -> ColumnElement[bool]:
    return ~exists().where(
        Batch.input_file_id == File.id, Batch.status.not_in(TERMINAL_BATCH_STATUSES)
    )


def _reclaim(session: Session, storage: Storage, rows: Iterable[File]) -> None:
    """Delete the bytes of files already invisible; an empty key marks them reclaimed."""
    for row in rows:
        storage.delete(row.storage_key)
        row.storage_key = ""


def _unreclaimed(session: Session, ids: Sequence[str] | None = None) -> Sequence[File]:
    stmt = select(File).where(
        File.deleted_at.is_not(None), File.storage_key != "", _not_read_by_running_batch()
    )
    if ids is not None:
        stmt = stmt.where(File.id.in_(ids))
    return session.scalars(stmt.order_by(File.seq).limit(SWEEP_LIMIT)).all()


def delete_file(session: Session, project_id: str, file_id: str) -> FileDeleted:
    """Delete a File: gone from the API at once; `reclaim_deleted` then removes its bytes."""
    get_file(session, project_id, file_id).deleted_at = _now()
    return FileDeleted(id=file_id)


def reclaim_deleted(session: Session, storage: Storage, file_id: str) -> None:
    """Remove a deleted File's bytes, unless a running batch still reads them."""
    _reclaim(session, storage, _unreclaimed(session, [file_id]))


def expire_files(session: Session, storage: Storage, now: int) -> int:
    """Housekeeping: hide files whose `expires_at` has passed and reclaim their bytes.

    Also reclaims the bytes of deleted files once no running batch reads them.
    Runs in the caller's transaction; returns how many files expired.
    """
    expired = session.scalars(
        select(File)
        .where(File.deleted_at.is_(None), File.expires_at <= now)
        .order_by(File.seq)
        .limit(SWEEP_LIMIT)
    ).all()
    for row in expired:
        row.deleted_at = now
    session.flush()
    _reclaim(session, storage, _unreclaimed(session))
    return len(expired)
