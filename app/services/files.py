"""Files: a project's stored files, found, listed and served.

A file's bytes live in storage under `files/{file_id}` (never under its name); its row says
who owns it and when it stops being visible. Receiving a client's file is `file_intake`;
deleting and expiring files is `file_expiry`.
"""

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Row, bindparam, or_, select
from sqlalchemy.orm import Session

from app.db.models import File
from app.errors import OpenAIError, not_found
from app.ids import new_file_id
from app.schemas.common import ListObject, SortOrder
from app.schemas.files import UNDOWNLOADABLE_PURPOSES, FileObject, FileStatus
from app.services.pagination import Pages, check_limit
from app.storage import Storage, StoredObject

MAX_LIST_LIMIT = 10_000
PREVIEW_LINES = 20
PREVIEW_BYTES = 64 * 1000


def file_storage_key(file_id: str) -> str:
    return f"files/{file_id}"


def now() -> int:
    return int(time.time())


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
        created_at=created_at if created_at is not None else now(),
        expires_at=expires_at,
    )
    session.add(row)
    session.flush()
    return row


def visible(now: int | BindParameter[int]) -> list[ColumnElement[bool]]:
    """SQL conditions: the file is neither deleted nor expired at `now`."""
    return [File.deleted_at.is_(None), or_(File.expires_at.is_(None), File.expires_at > now)]


# Built once: building a statement costs more than running it on a warm connection.
_BY_ID = (
    File.id == bindparam("file_id"),
    File.project_id == bindparam("project_id"),
    *visible(bindparam("now")),
)
_FILE_BY_ID = select(File).where(*_BY_ID)
# The columns `to_file_object` reads, for the routes that only show files: Core rows cost
# less than loading ORM objects.
_WIRE = select(
    File.id, File.bytes, File.created_at, File.filename, File.purpose, File.status, File.expires_at
)
_WIRE_BY_ID = _WIRE.where(*_BY_ID)
_PROJECT = [File.project_id == bindparam("project_id")]
_PAGES = Pages(File, query=_WIRE, scope=_PROJECT, visible=visible(bindparam("now")))
_PAGES_OF_PURPOSE = Pages(
    File,
    query=_WIRE,
    scope=_PROJECT,
    visible=[*visible(bindparam("now")), File.purpose == bindparam("purpose")],
)


def get_file(session: Session, project_id: str, file_id: str, *, param: str = "id") -> File:
    """The project's live File `file_id`, or OpenAI's 404 (also for other projects' files)."""
    row = session.scalar(_FILE_BY_ID, {"file_id": file_id, "project_id": project_id, "now": now()})
    if row is None:
        raise not_found("File", file_id, param=param)
    return row


def retrieve_file(session: Session, project_id: str, file_id: str) -> FileObject:
    params = {"file_id": file_id, "project_id": project_id, "now": now()}
    row = session.connection().execute(_WIRE_BY_ID, params).first()
    if row is None:
        raise not_found("File", file_id)
    return to_file_object(row)


def to_file_object(row: File | Row[*tuple[Any, ...]]) -> FileObject:
    """The File object, of a `File` or a row of its columns with the same names."""
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
    order: SortOrder,
    after: str | None,
) -> ListObject[FileObject]:
    check_limit(limit, MAX_LIST_LIMIT)
    pages = _PAGES if purpose is None else _PAGES_OF_PURPOSE
    params = {"project_id": project_id, "now": now(), "purpose": purpose}
    page = pages.page(session, params, after=after, limit=limit, order=order)
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


@dataclass
class Preview:
    lines: list[tuple[int, str]]  # (line number, text), the last cut short if the budget ended
    total_bytes: int
    complete: bool  # every line of the file is shown


def preview_file(
    session: Session,
    storage: Storage,
    project_id: str,
    file_id: str,
    *,
    max_lines: int = PREVIEW_LINES,
    max_bytes: int = PREVIEW_BYTES,
) -> Preview:
    """The first lines of a file, reading at most `max_bytes` of it from storage."""
    row = get_file(session, project_id, file_id)
    if row.purpose in UNDOWNLOADABLE_PURPOSES:
        raise OpenAIError(f"Not allowed to download files of purpose: {row.purpose}")
    end = min(row.bytes, max_bytes)
    data = b"".join(storage.read(row.storage_key, 0, end)) if end else b""
    pieces = data.split(b"\n")
    if end == row.bytes and pieces and not pieces[-1]:
        pieces.pop()  # the file's final newline ends the last line
    shown = pieces[:max_lines]
    complete = end == row.bytes and len(pieces) <= max_lines
    lines = [(i + 1, piece.decode("utf-8", "replace")) for i, piece in enumerate(shown)]
    return Preview(lines, row.bytes, complete)
