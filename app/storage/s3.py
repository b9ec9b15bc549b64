"""Storage in an S3 bucket (AWS, MinIO, any S3-compatible store) under an optional prefix.

A writer streams a multipart upload and completes it at commit, so an object appears
whole or not at all; an object smaller than one part is a single PUT at commit.
"""

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from app.storage.base import (
    KEY_FOLDERS,
    READ_CHUNK,
    HashingWriter,
    ListedObject,
    StorageFull,
    check_key,
    parse_s3_url,
)

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, MultipartUploadTypeDef

# S3 needs every part but the last to be at least 5 MiB; one part is all a writer buffers.
PART_SIZE = 8 << 20

# boto3's default checksums use aws-chunked uploads that several S3-compatible stores
# refuse; the sha256 every writer computes already guards the content.
_CLIENT_CONFIG = Config(
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
    retries={"mode": "standard"},
    # Each ranged download holds a connection while the caller streams it; the API serves
    # requests from a pool of 40 threads.
    max_pool_connections=64,
)


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _is_missing(exc: ClientError) -> bool:
    return _error_code(exc) in ("404", "NoSuchKey", "NotFound")


# What S3-compatible stores answer when out of space or over a quota (MinIO, Ceph, others).
_NO_SPACE_CODES = {
    "XMinioStorageFull",
    "XMinioAdminBucketQuotaExceeded",
    "InsufficientStorage",
    "QuotaExceeded",
}


def _refused_for_space(exc: ClientError) -> bool:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return _error_code(exc) in _NO_SPACE_CODES or status == 507


class S3Writer(HashingWriter):
    def __init__(self, client: "S3Client", bucket: str, name: str, key: str) -> None:
        super().__init__(key)
        self._client, self._bucket, self._name = client, bucket, name
        self._buffer = bytearray()
        self._upload_id: str | None = None
        self._parts: list[CompletedPartTypeDef] = []

    def _write(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= PART_SIZE:
            self._sending(self._upload_part, bytes(self._buffer[:PART_SIZE]))
            del self._buffer[:PART_SIZE]

    def _persist(self) -> None:
        if self._upload_id is None:
            self._sending(self._put, bytes(self._buffer))
        else:
            self._sending(self._complete, self._upload_id)
        self._buffer = bytearray()

    def abort(self) -> None:
        self._buffer = bytearray()
        upload_id, self._upload_id = self._upload_id, None
        if upload_id is None:
            return
        # The caller's own error matters more; a leftover upload is swept later.
        with contextlib.suppress(ClientError, BotoCoreError):
            self._client.abort_multipart_upload(
                Bucket=self._bucket, Key=self._name, UploadId=upload_id
            )

    def _sending(self, send: "Callable[[Any], None]", argument: Any) -> None:
        """Any failure aborts the upload; a refusal for want of space is `StorageFull`."""
        try:
            send(argument)
        except ClientError as exc:
            self.abort()
            if _refused_for_space(exc):
                raise StorageFull(
                    f"the S3 store s3://{self._bucket} refuses writes: {exc}"
                ) from exc
            raise
        except BaseException:
            self.abort()
            raise

    def _put(self, data: bytes) -> None:
        self._client.put_object(Bucket=self._bucket, Key=self._name, Body=data)

    def _upload_part(self, data: bytes) -> None:
        if self._upload_id is None:
            started = self._client.create_multipart_upload(Bucket=self._bucket, Key=self._name)
            self._upload_id = started["UploadId"]
        number = len(self._parts) + 1
        uploaded = self._client.upload_part(
            Bucket=self._bucket,
            Key=self._name,
            UploadId=self._upload_id,
            PartNumber=number,
            Body=data,
        )
        self._parts.append({"ETag": uploaded["ETag"], "PartNumber": number})

    def _complete(self, upload_id: str) -> None:
        if self._buffer:
            self._upload_part(bytes(self._buffer))
        self._client.complete_multipart_upload(
            Bucket=self._bucket,
            Key=self._name,
            UploadId=upload_id,
            MultipartUpload={"Parts": self._parts},
        )
        self._upload_id = None


class S3Storage:
    """Objects named `prefix + key` in one bucket, which must already exist."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix
        # A session of its own: boto3's default session is not safe to share across threads.
        session = boto3.session.Session()
        self.client: S3Client = session.client(
            "s3", endpoint_url=endpoint_url, config=_CLIENT_CONFIG
        )

    @classmethod
    def from_url(cls, url: str, endpoint_url: str | None = None) -> "S3Storage":
        bucket, prefix = parse_s3_url(url)
        return cls(bucket, prefix, endpoint_url)

    def name(self, key: str) -> str:
        return self.prefix + check_key(key)

    def writer(self, key: str) -> S3Writer:
        return S3Writer(self.client, self.bucket, self.name(key), key)

    def read(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        name = self.name(key)
        if end is not None and end <= start:
            return
        last = "" if end is None else str(end - 1)
        try:
            response = self.client.get_object(
                Bucket=self.bucket, Key=name, Range=f"bytes={start}-{last}"
            )
        except ClientError as exc:
            if _error_code(exc) == "InvalidRange":  # starts at or past the end
                return
            if _is_missing(exc):
                raise FileNotFoundError(key) from exc
            raise
        body = response["Body"]
        try:
            yield from body.iter_chunks(READ_CHUNK)
        finally:
            body.close()

    def size(self, key: str) -> int:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self.name(key))
        except ClientError as exc:
            if _is_missing(exc):
                raise FileNotFoundError(key) from exc
            raise
        return head["ContentLength"]

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except FileNotFoundError:
            return False
        return True

    def list(self, prefix: str) -> Iterator[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix
        )
        for page in pages:
            for item in page.get("Contents", []):
                yield item["Key"][len(self.prefix) :]

    def scan(self, folder: str, start_after: str = "") -> Iterator[ListedObject]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket,
            Prefix=self.prefix + check_key(folder),
            StartAfter=self.prefix + start_after,
        )
        for page in pages:
            for item in page.get("Contents", []):
                key = item["Key"][len(self.prefix) :]
                yield ListedObject(key, item["LastModified"].timestamp())

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=self.bucket, Key=self.name(key))

    def sweep_temp(self, older_than_seconds: float) -> int:
        """Abort the multipart uploads that a dead writer left open in overnight's folders
        (another application's, in the same bucket or prefix, are not ours to end)."""
        cutoff = time.time() - older_than_seconds
        aborted = 0
        for upload in self._open_uploads():
            if upload["Initiated"].timestamp() >= cutoff:
                continue
            with contextlib.suppress(ClientError):  # another sweeper got there first
                self.client.abort_multipart_upload(
                    Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted += 1
        return aborted

    def _open_uploads(self) -> "Iterator[MultipartUploadTypeDef]":
        paginator = self.client.get_paginator("list_multipart_uploads")
        for folder in KEY_FOLDERS:
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + folder):
                yield from page.get("Uploads", [])
