"""Stored files and the multipart uploads that make them."""

from sqlalchemy import BigInteger, ForeignKey, Index, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models.base import Base, PublicId, check_in, enum_type
from app.schemas.files import FileObjectPurpose, FileStatus
from app.schemas.uploads import UploadStatus


class File(PublicId, Base):
    __tablename__ = "files"
    __table_args__ = (
        check_in("status", FileStatus),
        Index("ix_files_project_listing", "project_id", "seq"),
    )

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"))
    filename: Mapped[str] = mapped_column(Text)
    purpose: Mapped[FileObjectPurpose] = mapped_column(enum_type(FileObjectPurpose, 32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    storage_key: Mapped[str] = mapped_column(String(512))
    status: Mapped[FileStatus] = mapped_column(
        enum_type(FileStatus, 16), default=FileStatus.PROCESSED
    )
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int | None] = mapped_column(BigInteger, index=True)
    deleted_at: Mapped[int | None] = mapped_column(BigInteger)


class Upload(PublicId, Base):
    __tablename__ = "uploads"
    __table_args__ = (check_in("status", UploadStatus),)

    project_id: Mapped[str] = mapped_column(ForeignKey("projects.id"), index=True)
    filename: Mapped[str] = mapped_column(Text)
    purpose: Mapped[str] = mapped_column(String(32))
    bytes: Mapped[int] = mapped_column(BigInteger)
    mime_type: Mapped[str] = mapped_column(String(256))
    status: Mapped[UploadStatus] = mapped_column(
        enum_type(UploadStatus, 16), default=UploadStatus.PENDING
    )
    created_at: Mapped[int] = mapped_column(BigInteger)
    expires_at: Mapped[int] = mapped_column(BigInteger, index=True)
    # Expiry the completed File gets, in seconds after its creation.
    file_expires_after: Mapped[int | None] = mapped_column(BigInteger)
    file_id: Mapped[str | None] = mapped_column(ForeignKey("files.id"))


class UploadPart(PublicId, Base):
    __tablename__ = "upload_parts"

    upload_id: Mapped[str] = mapped_column(ForeignKey("uploads.id"), index=True)
    bytes: Mapped[int] = mapped_column(BigInteger)
    storage_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[int] = mapped_column(BigInteger)
