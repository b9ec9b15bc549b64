"""Fetching the input: a local file or an http(s) URL, streamed into the work directory's store."""

from collections.abc import Iterator

import httpx

from app.offline.errors import OfflineError
from app.services.files import file_storage_key
from app.storage import Storage, StoredObject
from app.storage.base import READ_CHUNK, put

INPUT_FILE_ID = "file-offline-input"


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def read_source(source: str) -> Iterator[bytes]:
    if is_url(source):
        with httpx.stream("GET", source, follow_redirects=True, timeout=60) as response:
            if response.status_code >= 400:
                raise OfflineError(f"GET {source} answered {response.status_code}")
            yield from response.iter_bytes(READ_CHUNK)
        return
    try:
        f = open(source, "rb")  # noqa: SIM115 - closed below, read lazily
    except OSError as exc:
        raise OfflineError(f"cannot read {source}: {exc.strerror or exc}") from None
    with f:
        while chunk := f.read(READ_CHUNK):
            yield chunk


def store_input(storage: Storage, source: str) -> tuple[str, StoredObject]:
    key = file_storage_key(INPUT_FILE_ID)
    try:
        return key, put(storage, key, read_source(source))
    except httpx.HTTPError as exc:
        raise OfflineError(f"cannot GET {source}: {exc}") from None
