"""The API's write paths under injected faults: a file sent with `POST /v1/files`, and one sent
as an upload in two parts, through the official SDK on the real app (in process, its store
wrapped through the app's own dependency)."""

from collections.abc import Iterator
from contextlib import contextmanager

import openai
from fastapi.testclient import TestClient
from sqlalchemy import select

from app.api.deps import get_storage
from app.config import Settings
from app.db.models import Upload
from app.db.session import session_scope
from app.main import create_app
from app.schemas.uploads import UploadStatus
from app.storage import Storage
from tests.fault_pipeline import assert_files_intact
from tests.fault_points import Path

LOCAL = "http://127.0.0.1"
CONTENT = b"".join(b'{"custom_id": "u%d", "n": "%s"}\n' % (i, b"x" * 40) for i in range(40))


@contextmanager
def api(settings: Settings, storage: Storage) -> Iterator[openai.OpenAI]:
    """The SDK on the real app, whose routes write through `storage`."""
    app = create_app(settings)

    async def faulting_storage() -> Storage:
        return storage

    app.dependency_overrides[get_storage] = faulting_storage
    with (
        # An IP address: an open deployment answers only such hosts (and localhost).
        TestClient(app, base_url=LOCAL, raise_server_exceptions=False) as http,
        openai.OpenAI(
            base_url=f"{LOCAL}/v1", api_key="sk-test", http_client=http, max_retries=0
        ) as client,
    ):
        yield client


def send_file(client: openai.OpenAI) -> str:
    return client.files.create(file=("in.jsonl", CONTENT, "application/jsonl"), purpose="batch").id


def send_upload(client: openai.OpenAI) -> str:
    """An upload of `CONTENT` in two parts, completed; the File's id."""
    upload = client.uploads.create(
        bytes=len(CONTENT), filename="in.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    half = len(CONTENT) // 2
    parts = [
        client.uploads.parts.create(upload_id=upload.id, data=data).id
        for data in (CONTENT[:half], CONTENT[half:])
    ]
    done = client.uploads.complete(upload_id=upload.id, part_ids=parts)
    assert done.status == "completed" and done.file is not None
    return done.file.id


SEND = {Path.FILE: send_file, Path.UPLOAD: send_upload}


def send_through_faults(client: openai.OpenAI, path: Path) -> None:
    """What a client does at a point that raises: it sees an error (or, at a point after the
    last commit, nothing), and stops."""
    try:
        SEND[path](client)
    except openai.APIStatusError as error:
        assert error.status_code >= 500, error


def assert_api_intact(settings: Settings, storage: Storage, path: Path) -> None:
    """No visible partial File; a completed upload's File holds its parts; and the client's
    retry gets a whole File."""
    assert_files_intact(settings)
    with session_scope(settings) as session:
        completed = session.scalars(
            select(Upload.file_id).where(Upload.status == UploadStatus.COMPLETED)
        ).all()
    with api(settings, storage) as client:
        for file_id in completed:
            assert file_id is not None
            assert client.files.content(file_id).read() == CONTENT
        retried = SEND[path](client)
        assert client.files.content(retried).read() == CONTENT
    assert_files_intact(settings)
