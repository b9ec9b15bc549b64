"""Uploads: a large file sent as parts, then assembled into one File.

Each part is its own storage object, `uploads/{upload_id}/{part_id}`, so parts can
arrive in parallel. `complete` streams the chosen parts, in order, into a new File
object and only then registers it; an upload is `pending` until completed,
cancelled or past its one-hour life (then it behaves as `expired`). A part that would take
the parts past the upload's declared `bytes` is refused as it streams, and again when it is
recorded (two sent at once may each fit alone).
"""

import base64
import binascii
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.sizes import too_large_message
from app.db.models import File, Upload, UploadPart
from app.errors import OpenAIError, not_found
from app.ids import new_file_id, new_part_id, new_upload_id
from app.schemas.admin import Quota
from app.schemas.uploads import (
    UploadComplete,
    UploadCreate,
    UploadObject,
    UploadPartObject,
    UploadStatus,
)
from app.services import quotas
from app.services.file_intake import (
    LimitedWriter,
    check_batch_filename,
    check_filename,
    check_purpose,
    register_client_file,
    too_large,
)
from app.services.files import file_storage_key, to_file_object
from app.storage import Storage, StoredObject

SWEEP_LIMIT = 1000
_MIME_TYPE = re.compile(r"^[\w.+-]+/[\w.+-]+$")


def _now() -> int:
    return int(time.time())


def part_storage_prefix(upload_id: str) -> str:
    return f"uploads/{upload_id}/"


def delete_parts(storage: Storage, upload_id: str) -> None:
    # Listing the prefix also catches a part whose row was never written (crash).
    for key in list(storage.list(part_storage_prefix(upload_id))):
        storage.delete(key)


def status_of(row: Upload, now: int) -> UploadStatus:
    """The status clients see: a pending upload past its expiry is `expired`."""
    if row.status == UploadStatus.PENDING and now >= row.expires_at:
        return UploadStatus.EXPIRED
    return row.status


def to_upload_object(row: Upload, file: File | None = None, now: int | None = None) -> UploadObject:
    return UploadObject(
        id=row.id,
        bytes=row.bytes,
        created_at=row.created_at,
        expires_at=row.expires_at,
        filename=row.filename,
        purpose=row.purpose,
        status=status_of(row, _now() if now is None else now),
        file=None if file is None else to_file_object(file),
    )


def check_mime_type(mime_type: str, purpose: str) -> None:
    """Any well-formed type; batch input must be declared as JSON (Lines) or text."""
    essence = mime_type.split(";", 1)[0].strip().lower()
    if not _MIME_TYPE.match(essence):
        raise OpenAIError(
            f"Invalid 'mime_type': {mime_type!r} is not a MIME type.", param="mime_type"
        )
    subtype = essence.split("/", 1)[1]
    if purpose == "batch" and not (essence.startswith("text/") or "json" in subtype):
        raise OpenAIError(
            f"Invalid 'mime_type' for purpose 'batch': {mime_type!r}. Use application/jsonl "
            "(JSON and text types are accepted).",
            param="mime_type",
        )


def create_upload(
    session: Session, settings: Settings, project_id: str, body: UploadCreate
) -> UploadObject:
    check_purpose(body.purpose)
    filename = check_filename(body.filename, param="filename")
    limit = settings.size_limit("max_upload_bytes")
    if body.purpose == "batch":
        check_batch_filename(filename, param="filename")
        limit = settings.size_limit("max_batch_file_bytes")
    if body.bytes > limit.bytes:
        what = f"an upload with purpose '{body.purpose}'"
        raise OpenAIError(
            f"Invalid 'bytes': {too_large_message(what, limit, body.bytes)}",
            param="bytes",
            code="integer_above_max_value",
        )
    check_mime_type(body.mime_type, body.purpose)
    # Early: an upload whose file the quotas would refuse at `complete` takes no part.
    wanted = {Quota.OPEN_UPLOADS: 1, Quota.STORED_BYTES: body.bytes, Quota.FILES: 1}
    quotas.check(session, settings, project_id, wanted)
    now = _now()
    row = Upload(
        id=new_upload_id(),
        project_id=project_id,
        filename=filename,
        purpose=body.purpose,
        bytes=body.bytes,
        mime_type=body.mime_type,
        status=UploadStatus.PENDING,
        created_at=now,
        expires_at=now + settings.upload_ttl_seconds,
        file_expires_after=body.expires_after.seconds if body.expires_after else None,
    )
    session.add(row)
    session.flush()
    return to_upload_object(row, now=now)


def get_upload(session: Session, project_id: str, upload_id: str, *, lock: bool = False) -> Upload:
    """The project's Upload, or OpenAI's 404; `lock` serialises state changes on PostgreSQL."""
    stmt = select(Upload).where(Upload.id == upload_id, Upload.project_id == project_id)
    row = session.scalar(stmt.with_for_update() if lock else stmt)
    if row is None:
        raise not_found("Upload", upload_id, param="upload_id")
    return row


def require_pending(row: Upload, action: str) -> None:
    status = status_of(row, _now())
    if status != UploadStatus.PENDING:
        raise OpenAIError(
            f"Cannot {action} upload {row.id}: its status is '{status}' (only pending uploads "
            "accept this).",
            param="upload_id",
        )


# --- parts -------------------------------------------------------------------------------


@dataclass
class PartIntake:
    """The bytes of one part on their way into storage."""

    upload_id: str
    part_id: str
    sink: LimitedWriter


def start_part(
    session: Session, settings: Settings, storage: Storage, project_id: str, upload_id: str
) -> PartIntake:
    """Check the upload takes parts (before any byte is received) and open the part's writer,
    which refuses the part as soon as it passes what the upload and the project have room for."""
    upload = get_upload(session, project_id, upload_id)
    require_pending(upload, "add a part to")
    limit, refusal = _part_room(session, settings, upload)
    part_id = new_part_id()
    writer = storage.writer(part_storage_prefix(upload_id) + part_id)
    return PartIntake(upload_id, part_id, LimitedWriter(writer, limit, refusal))


def _part_room(session: Session, settings: Settings, upload: Upload) -> tuple[int, OpenAIError]:
    """The most a new part may hold, and the refusal past it: the tightest of the part limit,
    the upload's declared bytes not yet sent and the project's stored-bytes quota."""
    part_limit = settings.size_limit("max_upload_part_bytes")
    sent = stored_part_bytes(session, upload.id)
    rooms = [
        (part_limit.bytes, too_large("The upload part", part_limit, "data", "part_too_large")),
        (upload.bytes - sent, past_declared_bytes(upload, sent, None)),
    ]
    if (quota := quotas.room(session, settings, upload.project_id, Quota.STORED_BYTES)) is not None:
        rooms.append(quota)
    return min(rooms, key=lambda room: room[0])


def stored_part_bytes(session: Session, upload_id: str) -> int:
    """The bytes of the upload's recorded parts."""
    total = session.scalar(
        select(func.sum(UploadPart.bytes)).where(UploadPart.upload_id == upload_id)
    )
    return int(total or 0)


def past_declared_bytes(upload: Upload, sent: int, size: int | None) -> OpenAIError:
    """The refusal of a part of `size` bytes (None: still streaming, more than fits)."""
    room = upload.bytes - sent
    this = f"more than {room:,} bytes" if size is None else f"{size:,} bytes"
    return OpenAIError(
        f"The part would take upload {upload.id} past the bytes it was created with: "
        f"bytes={upload.bytes:,}, its parts so far hold {sent:,}, so {room:,} more fit; "
        f"this part has {this}.",
        param="data",
        code="upload_bytes_exceeded",
    )


def store_part(intake: PartIntake) -> StoredObject:
    """Commit a received part's bytes (with no transaction open)."""
    try:
        return intake.sink.commit()
    except BaseException:
        intake.sink.abort()
        raise


def record_part(
    session: Session, settings: Settings, project_id: str, intake: PartIntake, stored: StoredObject
) -> UploadPartObject:
    """Record a stored part, if the upload is still pending and it still fits.

    Checked again here, under the upload's lock: two parts sent at once both fit while they
    streamed, but only one may be recorded if together they do not.
    """
    upload = get_upload(session, project_id, intake.upload_id, lock=True)
    require_pending(upload, "add a part to")
    sent = stored_part_bytes(session, upload.id)
    if sent + stored.bytes > upload.bytes:
        raise past_declared_bytes(upload, sent, stored.bytes)
    quotas.check(session, settings, project_id, {Quota.STORED_BYTES: stored.bytes})
    part = UploadPart(
        id=intake.part_id,
        upload_id=upload.id,
        bytes=stored.bytes,
        storage_key=stored.key,
        created_at=_now(),
    )
    session.add(part)
    return UploadPartObject(id=part.id, created_at=part.created_at, upload_id=part.upload_id)


# --- complete and cancel -----------------------------------------------------------------


def _ordered_parts(session: Session, upload: Upload, part_ids: Sequence[str]) -> list[UploadPart]:
    seen: set[str] = set()
    for part_id in part_ids:
        if part_id in seen:
            raise OpenAIError(f"Part {part_id} is listed more than once.", param="part_ids")
        seen.add(part_id)
    rows = session.scalars(
        select(UploadPart).where(UploadPart.upload_id == upload.id, UploadPart.id.in_(part_ids))
    ).all()
    by_id = {row.id: row for row in rows}
    for part_id in part_ids:
        if part_id not in by_id:
            raise OpenAIError(f"No such part in upload {upload.id}: {part_id}", param="part_ids")
    parts = [by_id[part_id] for part_id in part_ids]
    total = sum(p.bytes for p in parts)
    if total != upload.bytes:
        raise OpenAIError(
            f"The parts add up to {total} bytes, but the upload was created with "
            f"bytes={upload.bytes}.",
            param="part_ids",
        )
    return parts


def _md5_matches(expected: str, digest: bytes) -> bool:
    """Hex (as OpenAI documents) or base64 (as in Content-MD5)."""
    wanted = expected.strip()
    if wanted.lower() == digest.hex():
        return True
    try:
        return base64.b64decode(wanted, validate=True) == digest
    except (binascii.Error, ValueError):
        return False


def parts_to_join(
    session: Session, project_id: str, upload_id: str, body: UploadComplete
) -> list[str]:
    """The storage keys of the parts `complete` names, in order, once they are checked."""
    upload = get_upload(session, project_id, upload_id)
    require_pending(upload, "complete")
    return [p.storage_key for p in _ordered_parts(session, upload, body.part_ids)]


def join_parts(storage: Storage, keys: Sequence[str], md5: str | None) -> tuple[str, StoredObject]:
    """Stream the parts into a new File's object (with no transaction open): its id and it."""
    file_id = new_file_id()
    writer = storage.writer(file_storage_key(file_id))
    digest = hashlib.md5(usedforsecurity=False)
    try:
        for key in keys:
            for chunk in storage.read(key):
                writer.write(chunk)
                digest.update(chunk)
        if md5 is not None and not _md5_matches(md5, digest.digest()):
            raise OpenAIError(
                f"The md5 checksum does not match the uploaded content "
                f"(got {md5}, content has {digest.hexdigest()}).",
                param="md5",
            )
    except FileNotFoundError:
        writer.abort()
        raise OpenAIError(
            "A part of this upload disappeared while completing it (was it cancelled?)."
        ) from None
    except BaseException:
        writer.abort()
        raise
    return file_id, writer.commit()


def record_completion(
    session: Session,
    settings: Settings,
    project_id: str,
    upload_id: str,
    joined: tuple[str, StoredObject],
) -> UploadObject:
    """Register the joined File and mark the upload completed, unless it ended meanwhile."""
    file_id, stored = joined
    upload = get_upload(session, project_id, upload_id, lock=True)
    if upload.status != UploadStatus.PENDING:
        require_pending(upload, "complete")
    quotas.check(session, settings, project_id, {Quota.FILES: 1})
    file = register_client_file(
        session,
        settings,
        project_id=project_id,
        file_id=file_id,
        filename=upload.filename,
        purpose=upload.purpose,
        stored=stored,
        expires_after_seconds=upload.file_expires_after,
    )
    upload.status = UploadStatus.COMPLETED
    upload.file_id = file.id
    return to_upload_object(upload, file)


def cancel_upload(session: Session, project_id: str, upload_id: str) -> UploadObject:
    """Cancel a pending upload; `delete_parts` then drops its parts."""
    upload = get_upload(session, project_id, upload_id, lock=True)
    require_pending(upload, "cancel")
    upload.status = UploadStatus.CANCELLED
    return to_upload_object(upload)


def expire_uploads(session: Session, storage: Storage, now: int) -> int:
    """Housekeeping: pending uploads past `expires_at` become `expired`; their parts go.

    Runs in the caller's transaction; returns how many uploads expired.
    """
    rows = session.scalars(
        select(Upload)
        .where(Upload.status == UploadStatus.PENDING, Upload.expires_at <= now)
        .order_by(Upload.seq)
        .limit(SWEEP_LIMIT)
    ).all()
    for row in rows:
        row.status = UploadStatus.EXPIRED
        delete_parts(storage, row.id)
    return len(rows)
