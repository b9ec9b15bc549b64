"""Files API end to end: the official SDK (strict), curl-style HTTP, storage and expiry."""

import asyncio
import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import select

from app.config import Settings
from app.db.models import Batch, File
from app.db.session import session_scope
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.file_expiry import expire_files
from app.storage import storage_for
from tests.forms import Part, content_type, multipart
from tests.harness import running_server
from tests.spec import assert_error, assert_matches_schema, schema_errors

THIRTY_DAYS = 30 * 24 * 3600


def jsonl(n: int) -> bytes:
    return b"".join(b'{"custom_id": "r%d", "n": %d}\n' % (i, i) for i in range(n))


def storage_keys(settings: Settings) -> list[str]:
    """Every committed object, and every temp file a writer left behind."""
    root = settings.storage_dir
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


def test_spec_helper_rejects_what_the_sdk_rejects() -> None:
    good = {
        "id": "file-abc",
        "object": "file",
        "bytes": 3,
        "created_at": 1,
        "filename": "a.jsonl",
        "purpose": "batch",
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }
    assert schema_errors(good, "OpenAIFile") == []
    assert schema_errors({**good, "purpose": "evals"}, "OpenAIFile")
    assert schema_errors({k: v for k, v in good.items() if k != "status"}, "OpenAIFile")
    assert schema_errors({**good, "created_at": 1.5}, "OpenAIFile")


def test_sdk_file_lifecycle(client: openai.OpenAI, tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl(20))
    raw = client.files.with_raw_response.create(file=path, purpose="batch")
    assert raw.headers["x-request-id"].startswith("req_")
    assert_matches_schema(raw.http_response.json(), "OpenAIFile")
    created = raw.parse()
    assert created.id.startswith("file-")
    assert (created.filename, created.purpose, created.bytes) == (
        "requests.jsonl",
        "batch",
        path.stat().st_size,
    )
    assert created.status == "processed" and created.status_details is None
    assert created.expires_at == created.created_at + THIRTY_DAYS
    assert raw.http_response.json()["status_details"] is None

    assert client.files.retrieve(created.id) == created
    content = client.files.content(created.id)
    assert content.content == path.read_bytes()
    assert content.response.headers["content-type"] == "application/octet-stream"
    assert content.response.headers["content-length"] == str(path.stat().st_size)
    assert [f.id for f in client.files.list()] == [created.id]

    with session_scope(settings) as session:
        row = session.scalar(select(File).where(File.id == created.id))
        assert row is not None
        assert row.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert row.storage_key == f"files/{created.id}"

    deleted = client.files.with_raw_response.delete(created.id)
    assert_matches_schema(deleted.http_response.json(), "DeleteFileResponse")
    assert deleted.http_response.json() == {"id": created.id, "object": "file", "deleted": True}
    for call in (client.files.retrieve, client.files.content, client.files.delete):
        with pytest.raises(openai.NotFoundError) as info:
            call(created.id)
        assert info.value.body == {
            "message": f"No such File object: {created.id}",
            "type": "invalid_request_error",
            "param": "id",
            "code": None,
        }
    assert client.files.list().data == []
    assert storage_keys(settings) == []


def test_async_sdk_file_lifecycle(async_client: openai.AsyncOpenAI) -> None:
    async def scenario() -> None:
        async with async_client as client:
            created = await client.files.create(
                file=("a.jsonl", jsonl(3)),
                purpose="batch",
                expires_after={"anchor": "created_at", "seconds": 3600},
            )
            assert created.expires_at == created.created_at + 3600
            assert await client.files.retrieve(created.id) == created
            assert (await client.files.content(created.id)).content == jsonl(3)
            page = await client.files.list(purpose="batch")
            assert [f.id async for f in page] == [created.id]
            assert (await client.files.delete(created.id)).deleted is True
            with pytest.raises(openai.NotFoundError):
                await client.files.retrieve(created.id)

    asyncio.run(scenario())


def test_purposes_and_downloads(client: openai.OpenAI) -> None:
    # Raw bytes from the SDK arrive with the filename `upload`.
    user_data = client.files.create(file=b"notes", purpose="user_data")
    assert (user_data.filename, user_data.purpose, user_data.expires_at) == (
        "upload",
        "user_data",
        None,
    )
    for purpose in ("assistants", "user_data"):
        made = client.files.create(file=("x.txt", b"x"), purpose=purpose)
        with pytest.raises(openai.BadRequestError) as info:
            client.files.content(made.id)
        assert info.value.message.startswith("Error code: 400")
        assert f"Not allowed to download files of purpose: {purpose}" in info.value.message
    vision = client.files.create(file=("x.png", b"\x89PNG"), purpose="vision")
    assert client.files.content(vision.id).content == b"\x89PNG"
    empty = client.files.create(file=("empty.jsonl", b""), purpose="batch")
    assert empty.bytes == 0 and client.files.content(empty.id).content == b""
    assert {f.purpose for f in client.files.list(purpose="user_data")} == {"user_data"}
    assert len(client.files.list().data) == 5


def test_pagination(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = [client.files.create(file=(f"{i}.jsonl", b"{}\n"), purpose="batch").id for i in range(25)]
    newest_first = ids[::-1]

    first = client.files.list(limit=10)
    assert [f.id for f in first.data] == newest_first[:10] and first.has_more is True
    assert [f.id for f in client.files.list(limit=10)] == newest_first  # auto-pagination
    assert [f.id for f in client.files.list(limit=7, order="asc")] == ids
    assert [f.id for f in client.files.list(after=ids[10], order="asc")] == ids[11:]
    assert [f.id for f in client.files.list(after=ids[10])] == newest_first[15:]

    body = http.get("/v1/files", params={"limit": 10, "after": newest_first[9]}).json()
    assert_matches_schema(body, "ListFilesResponse")
    assert body["object"] == "list" and body["has_more"] is True
    assert (body["first_id"], body["last_id"]) == (newest_first[10], newest_first[19])
    last = http.get("/v1/files", params={"limit": 5, "after": newest_first[-5]}).json()
    assert [f["id"] for f in last["data"]] == newest_first[-4:] and last["has_more"] is False

    end = http.get("/v1/files", params={"after": newest_first[-1]}).json()
    assert end == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }

    # A cursor that was deleted since the previous page still pages on.
    client.files.delete(newest_first[9])
    rest = http.get("/v1/files", params={"limit": 3, "after": newest_first[9]}).json()
    assert [f["id"] for f in rest["data"]] == newest_first[10:13]
    assert http.get("/v1/files", params={"purpose": "batch_output"}).json()["data"] == []


def test_curl_forms(http: httpx.Client, settings: Settings) -> None:
    # curl -F purpose=batch -F file=@x.jsonl
    created = http.post(
        "/v1/files",
        data={"purpose": "batch"},
        files={"file": ("x.jsonl", jsonl(2), "application/octet-stream")},
    )
    assert created.status_code == 200, created.text
    assert_matches_schema(created.json(), "OpenAIFile")

    # The file first and the fields after it, with bracketed expiry fields.
    body = multipart(
        Part("file", jsonl(4), filename=b"late.jsonl"),
        Part("expires_after[anchor]", b"created_at"),
        Part("expires_after[seconds]", b"7200"),
        Part("purpose", b"batch"),
    )
    late = http.post("/v1/files", content=body, headers=content_type()).json()
    assert (late["filename"], late["bytes"]) == ("late.jsonl", len(jsonl(4)))
    assert late["expires_at"] == late["created_at"] + 7200

    # Chunked transfer encoding: no Content-Length.
    def chunks() -> Iterator[bytes]:
        whole = multipart(Part("purpose", b"batch"), Part("file", jsonl(50), filename=b"c.jsonl"))
        for i in range(0, len(whole), 97):
            yield whole[i : i + 97]

    chunked = http.post("/v1/files", content=chunks(), headers=content_type())
    assert chunked.status_code == 200, chunked.text
    assert chunked.json()["bytes"] == len(jsonl(50))

    download = http.get(
        f"/v1/files/{chunked.json()['id']}/content", headers={"Accept": "application/binary"}
    )
    assert download.status_code == 200 and download.content == jsonl(50)
    assert download.headers["content-type"] == "application/octet-stream"

    # Empty-body DELETE with a JSON content type, as the SDK sends it.
    deleted = http.delete(f"/v1/files/{late['id']}", headers={"Content-Type": "application/json"})
    assert deleted.json() == {"id": late["id"], "object": "file", "deleted": True}
    assert not any(k.startswith(".tmp/") for k in storage_keys(settings))


def test_large_upload_streams_in_batches(http: httpx.Client, settings: Settings) -> None:
    data = jsonl(120_000)  # ~3.6 MB: several flushes of the multipart reader
    created = http.post(
        "/v1/files", data={"purpose": "batch"}, files={"file": ("big.jsonl", data)}
    ).json()
    assert created["bytes"] == len(data)
    with session_scope(settings) as session:
        row = session.scalar(select(File).where(File.id == created["id"]))
        assert row is not None and row.sha256 == hashlib.sha256(data).hexdigest()
    assert http.get(f"/v1/files/{created['id']}/content").content == data


def test_hostile_filenames_are_kept_as_data(
    http: httpx.Client, settings: Settings, tmp_path: Path
) -> None:
    names = {
        b"../../x.jsonl": "../../x.jsonl",
        b"a%20b%2F..%2Fc.jsonl": "a%20b%2F..%2Fc.jsonl",
        "caf\u00e9 \u2603.jsonl".encode(): "caf\u00e9 \u2603.jsonl",
        b"caf\xe9.jsonl": "caf\u00e9.jsonl",  # not UTF-8: read as Latin-1
        b"/etc/passwd.jsonl": "/etc/passwd.jsonl",
    }
    ids = []
    for raw, shown in names.items():
        body = multipart(Part("purpose", b"batch"), Part("file", b"{}\n", filename=raw))
        response = http.post("/v1/files", content=body, headers=content_type())
        assert response.status_code == 200, (raw, response.text)
        assert response.json()["filename"] == shown
        assert http.get(f"/v1/files/{response.json()['id']}").json()["filename"] == shown
        ids.append(response.json()["id"])
    assert storage_keys(settings) == sorted(f"files/{i}" for i in ids)
    outside = [p for p in tmp_path.parent.rglob("x.jsonl")] + list(Path("/etc").glob("*.jsonl"))
    assert outside == []

    control = multipart(Part("purpose", b"batch"), Part("file", b"{}", filename=b"a\x01b.jsonl"))
    assert_error(
        http.post("/v1/files", content=control, headers=content_type()),
        400,
        message="control characters",
    )


def test_expired_files_disappear_and_bytes_are_reclaimed(
    client: openai.OpenAI, settings: Settings
) -> None:
    short = client.files.create(
        file=("short.jsonl", b"{}\n"),
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 3600},
    )
    kept = client.files.create(file=("kept.txt", b"keep"), purpose="user_data")
    storage = storage_for(str(settings.storage_dir))
    assert storage.exists(f"files/{short.id}")

    with session_scope(settings) as session:
        assert expire_files(session, storage, now=short.created_at + 3599) == 0
    assert client.files.retrieve(short.id).id == short.id

    with session_scope(settings) as session:
        assert expire_files(session, storage, now=short.created_at + 3600) == 1
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(short.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(short.id)
    assert [f.id for f in client.files.list()] == [kept.id]
    assert not storage.exists(f"files/{short.id}")
    assert storage.exists(f"files/{kept.id}")
    with session_scope(settings) as session:
        assert expire_files(session, storage, now=int(time.time()) + 10 * THIRTY_DAYS) == 0


def test_bytes_of_a_running_batch_input_outlive_its_deletion(
    client: openai.OpenAI, settings: Settings
) -> None:
    source = client.files.create(file=("in.jsonl", jsonl(2)), purpose="batch")
    storage = storage_for(str(settings.storage_dir))
    now = int(time.time())
    with session_scope(settings) as session:
        session.add(
            Batch(
                id="batch_test",
                project_id=ensure_project(session, DEFAULT_PROJECT).id,
                endpoint="/v1/chat/completions",
                input_file_id=source.id,
                completion_window="24h",
                status="in_progress",
                created_at=now,
                expires_at=now + 86400,
            )
        )
    client.files.delete(source.id)
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(source.id)
    assert storage.exists(f"files/{source.id}")  # the worker still reads it

    with session_scope(settings) as session:
        expire_files(session, storage, now=int(time.time()))
    assert storage.exists(f"files/{source.id}")

    with session_scope(settings) as session:
        batch = session.scalar(select(Batch).where(Batch.id == "batch_test"))
        assert batch is not None
        batch.status = "completed"
    with session_scope(settings) as session:
        expire_files(session, storage, now=int(time.time()))
    assert not storage.exists(f"files/{source.id}")


def test_upload_limits_from_settings(settings: Settings) -> None:
    small = settings.model_copy(update={"max_file_bytes": 4000, "max_batch_file_bytes": 1000})
    with running_server(small) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        _check_limits(http)
        # Only the accepted files remain: refused uploads leave no object and no temp file.
        listed = http.get("/v1/files").json()["data"]
        assert storage_keys(small) == sorted(f"files/{f['id']}" for f in listed)


def _check_limits(http: httpx.Client) -> None:
    def post(*parts: Part) -> httpx.Response:
        return http.post("/v1/files", content=multipart(*parts), headers=content_type())

    ok = post(Part("purpose", b"batch"), Part("file", b"x" * 1000, filename=b"ok.jsonl"))
    assert ok.status_code == 200
    http.delete(f"/v1/files/{ok.json()['id']}")

    # Purpose first: refused while streaming. Purpose last: refused once known.
    error = assert_error(
        post(Part("purpose", b"batch"), Part("file", b"x" * 1001, filename=b"a.jsonl")), 413
    )
    # Sizes in human units, with the setting that sets the limit.
    assert error["message"] == (
        "The Batch API input file is larger than the limit of 1 kB "
        "(OVERNIGHT_MAX_BATCH_FILE_BYTES)."
    )
    late = assert_error(
        post(Part("file", b"x" * 1001, filename=b"a.jsonl"), Part("purpose", b"batch")), 413
    )
    assert late["message"] == (
        "The Batch API input file is 1,001 bytes; the limit is 1,000 bytes "
        "(OVERNIGHT_MAX_BATCH_FILE_BYTES)."
    )
    # Other purposes have the general limit.
    assert post(Part("purpose", b"user_data"), Part("file", b"x" * 3000, filename=b"a")).is_success
    assert_error(
        post(Part("purpose", b"user_data"), Part("file", b"x" * 4001, filename=b"a")),
        413,
        message="The file is larger than the limit of 4 kB (OVERNIGHT_MAX_FILE_BYTES).",
    )
    # A declared Content-Length past the limit is refused before the body is read.
    huge = http.post(
        "/v1/files",
        content=b"x" * (4000 + (1 << 20) + 1),
        headers=content_type(),
    )
    assert_error(
        huge,
        413,
        message="The request body is 1.1 MB; the limit is 4 kB (OVERNIGHT_MAX_FILE_BYTES).",
    )


def test_batch_file_without_extension_is_judged_by_its_content(
    client: openai.OpenAI, http: httpx.Client, settings: Settings
) -> None:
    # The SDK sends raw bytes as a file named `upload` (openai-batch's CLI does that).
    data = b'\xef\xbb\xbf  {"custom_id": "a"}\n'
    raw = client.files.create(file=data, purpose="batch")
    assert raw.filename == "upload" and raw.bytes == len(data)
    # The purpose after the file: the content rule holds all the same.
    late = http.post(
        "/v1/files",
        content=multipart(Part("file", jsonl(2), filename=b"requests"), Part("purpose", b"batch")),
        headers=content_type(),
    )
    assert late.status_code == 200, late.text
    refused = "Invalid file format for Batch API. Must be .jsonl"
    for name, data in (("upload", b"a,b,c\n1,2,3\n"), ("upload", b""), ("a.txt", jsonl(1))):
        with pytest.raises(openai.BadRequestError) as bad:
            client.files.create(file=(name, data), purpose="batch")
        assert bad.value.body == {
            "message": refused,
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    assert_error(
        http.post(
            "/v1/files",
            content=multipart(Part("file", b"x,y\n", filename=b"data"), Part("purpose", b"batch")),
            headers=content_type(),
        ),
        400,
        message=refused,
    )
    # Other purposes never cared about the name.
    assert client.files.create(file=b"a,b\n", purpose="user_data").filename == "upload"
    with session_scope(settings) as session:
        assert session.scalar(select(File.filename).where(File.id == raw.id)) == "upload"
