"""Uploads API end to end: parts, completion into a File, cancel, expiry, curl forms."""

import asyncio
import hashlib
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from select import select as ready_to_read

import httpx
import openai
import pytest
from sqlalchemy import select

from app.config import Settings
from app.db.models import Upload
from app.db.session import session_scope
from app.services.uploads import expire_uploads
from app.storage import storage_for
from tests.forms import BOUNDARY, JSON_TYPE, Part, content_type, multipart
from tests.harness import RunningServer, running_server
from tests.spec import assert_error, assert_matches_schema

CURL_KEY = "sk-uploads-curl"


def payload(size: int) -> bytes:
    line = b'{"custom_id": "x", "body": {}}\n'
    return (line * (size // len(line) + 1))[:size]


def part_keys(settings: Settings, upload_id: str) -> list[str]:
    return list(storage_for(str(settings.storage_dir)).list(f"uploads/{upload_id}/"))


def test_upload_file_chunked(client: openai.OpenAI, tmp_path: Path, settings: Settings) -> None:
    path = tmp_path / "big.jsonl"
    path.write_bytes(payload(10_000))
    md5 = hashlib.md5(path.read_bytes()).hexdigest()
    upload = client.uploads.upload_file_chunked(
        file=path, mime_type="application/jsonl", purpose="batch", part_size=3000, md5=md5
    )
    assert upload.status == "completed" and upload.filename == "big.jsonl"
    assert upload.expires_at == upload.created_at + 3600
    assert upload.file is not None
    assert (upload.file.bytes, upload.file.purpose, upload.file.filename) == (
        10_000,
        "batch",
        "big.jsonl",
    )
    assert upload.file.expires_at == upload.file.created_at + 30 * 24 * 3600
    assert client.files.retrieve(upload.file.id) == upload.file
    assert client.files.content(upload.file.id).content == path.read_bytes()
    assert part_keys(settings, upload.id) == []


def test_async_upload_file_chunked(async_client: openai.AsyncOpenAI) -> None:
    data = payload(5000)

    async def scenario() -> None:
        async with async_client as client:
            upload = await client.uploads.upload_file_chunked(
                file=data,
                filename="mem.jsonl",
                bytes=len(data),
                mime_type="text/jsonl",
                purpose="batch",
                part_size=2048,
            )
            assert upload.status == "completed" and upload.file is not None
            assert (await client.files.content(upload.file.id)).content == data
            pending = await client.uploads.create(
                bytes=1, filename="n.jsonl", mime_type="application/jsonl", purpose="batch"
            )
            assert (await client.uploads.cancel(pending.id)).status == "cancelled"

    asyncio.run(scenario())


def test_every_response_matches_the_spec(client: openai.OpenAI, http: httpx.Client) -> None:
    data = payload(2500)
    created = client.uploads.with_raw_response.create(
        bytes=len(data),
        filename="spec.jsonl",
        mime_type="application/jsonl",
        purpose="batch",
        expires_after={"anchor": "created_at", "seconds": 7200},
    )
    body = created.http_response.json()
    assert_matches_schema(body, "Upload")
    assert body["status"] == "pending" and body["file"] is None and body["object"] == "upload"
    upload_id = body["id"]
    assert upload_id.startswith("upload_")

    part_ids = []
    for start in (0, 1000, 2000):
        raw = client.uploads.parts.with_raw_response.create(
            upload_id=upload_id, data=data[start : start + 1000]
        )
        part = raw.http_response.json()
        assert_matches_schema(part, "UploadPart")
        assert part["object"] == "upload.part" and part["upload_id"] == upload_id
        assert part["id"].startswith("part_")
        part_ids.append(part["id"])

    completed = client.uploads.with_raw_response.complete(upload_id=upload_id, part_ids=part_ids)
    final = completed.http_response.json()
    assert_matches_schema(final, "Upload")
    assert final["status"] == "completed"
    assert_matches_schema(final["file"], "OpenAIFile")
    assert final["file"]["expires_at"] == final["file"]["created_at"] + 7200
    assert http.get(f"/v1/files/{final['file']['id']}/content").content == data


def test_parts_in_parallel_and_any_order(client: openai.OpenAI, settings: Settings) -> None:
    chunks = [bytes([65 + i]) * 700 for i in range(6)]
    upload = client.uploads.create(
        bytes=700 * 6, filename="p.jsonl", mime_type="application/json", purpose="batch"
    )
    with ThreadPoolExecutor(4) as pool:
        parts = list(
            pool.map(lambda c: client.uploads.parts.create(upload_id=upload.id, data=c), chunks)
        )
    assert len(part_keys(settings, upload.id)) == 6
    order = [5, 0, 3, 1, 4, 2]
    done = client.uploads.complete(upload_id=upload.id, part_ids=[parts[i].id for i in order])
    assert done.file is not None
    assert client.files.content(done.file.id).content == b"".join(chunks[i] for i in order)
    assert part_keys(settings, upload.id) == []


def test_completion_rules(client: openai.OpenAI, http: httpx.Client, settings: Settings) -> None:
    data = payload(1500)
    upload = client.uploads.create(
        bytes=1500, filename="r.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    a = client.uploads.parts.create(upload_id=upload.id, data=data[:1000])
    b = client.uploads.parts.create(upload_id=upload.id, data=data[1000:])
    other = client.uploads.create(
        bytes=10, filename="o.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    foreign = client.uploads.parts.create(upload_id=other.id, data=b"0123456789")

    def complete(part_ids: list[str], md5: str | None = None) -> httpx.Response:
        body: dict[str, object] = {"part_ids": part_ids}
        if md5 is not None:
            body["md5"] = md5
        return http.post(f"/v1/uploads/{upload.id}/complete", json=body)

    assert_error(complete([a.id]), 400, param="part_ids", message="add up to 1000 bytes")
    assert_error(complete([a.id, b.id, b.id]), 400, param="part_ids", message="more than once")
    assert_error(complete([a.id, "part_nope"]), 400, param="part_ids", message="part_nope")
    assert_error(complete([a.id, foreign.id]), 400, param="part_ids", message=foreign.id)
    assert_error(complete([a.id, b.id], md5="0" * 32), 400, param="md5")
    assert_error(
        http.post(f"/v1/uploads/{upload.id}/complete", content=b"{}", headers=JSON_TYPE), 400
    )

    # Nothing was created by the failed attempts; the right md5 (hex or base64) completes it.
    assert client.files.list().data == []
    md5 = hashlib.md5(data).hexdigest()
    done = complete([a.id, b.id], md5=md5.upper())
    assert done.status_code == 200, done.text
    assert client.files.content(done.json()["file"]["id"]).content == data

    for after in (
        http.post(f"/v1/uploads/{upload.id}/parts", files={"data": ("d", b"x")}),
        complete([a.id, b.id]),
        http.post(f"/v1/uploads/{upload.id}/cancel"),
    ):
        assert_error(after, 400, param="upload_id", message="'completed'")

    cancelled = client.uploads.cancel(other.id)
    assert cancelled.status == "cancelled" and cancelled.file is None
    assert part_keys(settings, other.id) == []
    for after in (
        http.post(f"/v1/uploads/{other.id}/parts", files={"data": ("d", b"x")}),
        http.post(f"/v1/uploads/{other.id}/complete", json={"part_ids": [foreign.id]}),
        http.post(f"/v1/uploads/{other.id}/cancel", headers={"Content-Type": "application/json"}),
    ):
        assert_error(after, 400, message="'cancelled'")


def test_md5_in_base64_and_empty_upload(client: openai.OpenAI) -> None:
    import base64

    data = b"hello\n"
    upload = client.uploads.create(
        bytes=len(data), filename="h.txt", mime_type="text/plain", purpose="user_data"
    )
    part = client.uploads.parts.create(upload_id=upload.id, data=data)
    md5 = base64.b64encode(hashlib.md5(data).digest()).decode()
    done = client.uploads.complete(upload_id=upload.id, part_ids=[part.id], md5=md5)
    assert done.file is not None and done.file.bytes == len(data) and done.file.expires_at is None

    empty = client.uploads.create(
        bytes=0, filename="e.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    finished = client.uploads.complete(upload_id=empty.id, part_ids=[])
    assert finished.file is not None and finished.file.bytes == 0


def test_expiry(client: openai.OpenAI, http: httpx.Client, settings: Settings) -> None:
    upload = client.uploads.create(
        bytes=4, filename="x.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    client.uploads.parts.create(upload_id=upload.id, data=b"{}\n\n")
    storage = storage_for(str(settings.storage_dir))

    with session_scope(settings) as session:
        assert expire_uploads(session, storage, now=upload.expires_at - 1) == 0
    assert len(part_keys(settings, upload.id)) == 1
    with session_scope(settings) as session:
        assert expire_uploads(session, storage, now=upload.expires_at) == 1
    assert part_keys(settings, upload.id) == []
    assert_error(
        http.post(f"/v1/uploads/{upload.id}/parts", files={"data": ("d", b"x")}),
        400,
        message="'expired'",
    )

    # Past its expiry an upload is expired even before housekeeping runs.
    late = client.uploads.create(
        bytes=1, filename="l.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    with session_scope(settings) as session:
        row = session.scalar(select(Upload).where(Upload.id == late.id))
        assert row is not None
        row.expires_at = row.created_at - 1
    assert_error(http.post(f"/v1/uploads/{late.id}/cancel"), 400, message="'expired'")
    assert_error(
        http.post(f"/v1/uploads/{late.id}/complete", json={"part_ids": []}),
        400,
        message="'expired'",
    )


def test_curl_forms(settings: Settings) -> None:
    # With keys, as curl users call a deployment (open mode takes JSON as application/json
    # only: a web page could send anything else, tests/test_browser_guard.py).
    keyed = settings.model_copy(update={"admin_key": CURL_KEY})
    bearer = {"Authorization": f"Bearer {CURL_KEY}"}
    with (
        running_server(keyed) as server,
        httpx.Client(timeout=60, base_url=server.url, headers=bearer) as http,
    ):
        curl_forms(http)


def curl_forms(http: httpx.Client) -> None:
    # curl -d '{...}' without a JSON content type: the body is JSON all the same.
    created = http.post(
        "/v1/uploads",
        content=b'{"purpose": "batch", "filename": "c.jsonl", "bytes": 14, '
        b'"mime_type": "application/jsonl"}',
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert created.status_code == 200, created.text
    upload_id = created.json()["id"]

    # curl -F data="..." (a text field) and curl -F data=@file (a file part).
    text_part = http.post(
        f"/v1/uploads/{upload_id}/parts",
        content=multipart(Part("data", b"aGVsbG8=")),
        headers=content_type(),
    )
    assert text_part.status_code == 200, text_part.text
    file_part = http.post(f"/v1/uploads/{upload_id}/parts", files={"data": ("f", b"\nworld")})
    assert_matches_schema(file_part.json(), "UploadPart")

    done = http.post(
        f"/v1/uploads/{upload_id}/complete",
        content=b'{"part_ids": ["%s", "%s"]}'
        % (text_part.json()["id"].encode(), file_part.json()["id"].encode()),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert done.status_code == 200, done.text
    file_id = done.json()["file"]["id"]
    assert http.get(f"/v1/files/{file_id}/content").content == b"aGVsbG8=\nworld"

    missing = http.post(
        f"/v1/uploads/{upload_id}/parts",
        content=multipart(Part("other", b"x")),
        headers=content_type(),
    )
    assert_error(missing, 400, param="upload_id")  # completed: refused before the body


def test_create_rules(http: httpx.Client) -> None:
    def create(**changes: object) -> httpx.Response:
        body = {"purpose": "batch", "filename": "a.jsonl", "bytes": 10, "mime_type": "text/jsonl"}
        body.update(changes)
        return http.post("/v1/uploads", json={k: v for k, v in body.items() if v is not None})

    assert create(extra_field="tolerated").status_code == 200
    assert create(purpose="fine-tune", filename="a.bin", mime_type="application/x-bin").is_success
    assert_error(create(filename="a.csv"), 400, message="Must be .jsonl")
    assert_error(create(mime_type="image/png"), 400, param="mime_type")
    assert_error(create(mime_type="nonsense"), 400, param="mime_type")
    assert_error(create(purpose="evals"), 400, param="purpose", message="evals")
    assert_error(create(purpose="nope"), 400, param="purpose")
    assert_error(create(bytes=200_000_001), 400, param="bytes")
    assert_error(create(bytes=-1), 400, param="bytes")
    assert_error(create(purpose="user_data", bytes=8_000_000_001), 400, param="bytes")
    assert_error(create(mime_type=None), 400, param="mime_type", message="Missing")
    assert_error(create(expires_after={"anchor": "created_at", "seconds": 60}), 400)
    assert_error(create(expires_after={"anchor": "last_active_at", "seconds": 3600}), 400)
    assert_error(http.post("/v1/uploads", content=b"[1]", headers=JSON_TYPE), 400)
    assert_error(http.post("/v1/uploads", content=b"{nope", headers=JSON_TYPE), 400)


def test_part_size_limit(settings: Settings) -> None:
    small = settings.model_copy(update={"max_upload_part_bytes": 1000})
    with running_server(small) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        upload = http.post(
            "/v1/uploads",
            json={
                "purpose": "batch",
                "filename": "a.jsonl",
                "bytes": 2000,
                "mime_type": "text/plain",
            },
        ).json()
        ok = http.post(f"/v1/uploads/{upload['id']}/parts", files={"data": ("d", b"x" * 1000)})
        assert ok.status_code == 200
        too_big = http.post(f"/v1/uploads/{upload['id']}/parts", files={"data": ("d", b"x" * 1001)})
        assert_error(
            too_big,
            413,
            param="data",
            message="The upload part is larger than the limit of 1 kB "
            "(OVERNIGHT_MAX_UPLOAD_PART_BYTES).",
        )
        assert part_keys(small, upload["id"]) == [f"uploads/{upload['id']}/{ok.json()['id']}"]
        assert list((small.storage_dir / ".tmp").iterdir()) == []


def test_parts_need_data(http: httpx.Client) -> None:
    upload = http.post(
        "/v1/uploads",
        json={"purpose": "batch", "filename": "a.jsonl", "bytes": 1, "mime_type": "text/plain"},
    ).json()
    response = http.post(
        f"/v1/uploads/{upload['id']}/parts",
        content=multipart(Part("file", b"x", filename=b"f")),
        headers=content_type(),
    )
    assert_error(response, 400, param="data", message="Missing required parameter: 'data'")


def test_an_upload_past_the_limit_says_so_in_human_units(http: httpx.Client) -> None:
    declared = {"filename": "big.jsonl", "mime_type": "application/jsonl"}
    batch = http.post("/v1/uploads", json={**declared, "purpose": "batch", "bytes": 210_000_000})
    assert_error(
        batch,
        400,
        param="bytes",
        message="Invalid 'bytes': an upload with purpose 'batch' is 210 MB; the limit is 200 MB "
        "(OVERNIGHT_MAX_BATCH_FILE_BYTES).",
    )
    other = {**declared, "filename": "big.bin", "mime_type": "application/octet-stream"}
    huge = http.post("/v1/uploads", json={**other, "purpose": "user_data", "bytes": 9 * 10**9})
    assert_error(huge, 400, message="is 9 GB; the limit is 8 GB (OVERNIGHT_MAX_UPLOAD_BYTES).")


# -- a part past the upload's declared bytes --


def test_a_part_past_the_declared_bytes_is_refused(
    client: openai.OpenAI, http: httpx.Client, settings: Settings
) -> None:
    upload = client.uploads.create(
        bytes=10, filename="s.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.uploads.parts.create(upload_id=upload.id, data=b"x" * (1 << 20))
    assert refused.value.code == "upload_bytes_exceeded" and refused.value.param == "data"
    assert refused.value.body == {
        "message": f"The part would take upload {upload.id} past the bytes it was created "
        "with: bytes=10, its parts so far hold 0, so 10 more fit; this part has more than "
        "10 bytes.",
        "type": "invalid_request_error",
        "param": "data",
        "code": "upload_bytes_exceeded",
    }
    assert part_keys(settings, upload.id) == []

    # Parts that fit are taken; the next one is measured against what they left.
    first = client.uploads.parts.create(upload_id=upload.id, data=b"{}\n{}\n{")
    over = http.post(f"/v1/uploads/{upload.id}/parts", files={"data": ("d", b"}\n\n\n")})
    assert_error(over, 400, param="data", message="its parts so far hold 7, so 3 more fit")
    last = client.uploads.parts.create(upload_id=upload.id, data=b"}\n\n")
    assert len(part_keys(settings, upload.id)) == 2
    done = client.uploads.complete(upload_id=upload.id, part_ids=[first.id, last.id])
    assert done.file is not None and done.file.bytes == 10
    assert list((settings.storage_dir / ".tmp").iterdir()) == []


def _part_head(upload_id: str, data_bytes: int) -> tuple[bytes, bytes]:
    """A part request's head and body up to its data, for `data_bytes` of data; and the
    body's end."""
    opening = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="data"; filename="d"\r\n\r\n'
    ).encode()
    closing = f"\r\n--{BOUNDARY}--\r\n".encode()
    head = (
        f"POST /v1/uploads/{upload_id}/parts HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
        f"Content-Length: {len(opening) + data_bytes + len(closing)}\r\n\r\n"
    ).encode()
    return head + opening, closing


def _connect(server: RunningServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _answer(sock: socket.socket) -> bytes:
    received = b""
    while not received.endswith(b"}") and (chunk := sock.recv(65536)):
        received += chunk
    return received


def _new_upload(http: httpx.Client, size: int) -> str:
    body = {"purpose": "batch", "filename": "r.jsonl", "bytes": size, "mime_type": "text/plain"}
    upload_id: str = http.post("/v1/uploads", json=body).json()["id"]
    return upload_id


def test_an_oversize_part_is_refused_while_it_streams(
    server: RunningServer, http: httpx.Client, settings: Settings
) -> None:
    upload_id = _new_upload(http, 10)
    announced = 32 << 20
    opening, _closing = _part_head(upload_id, announced)
    sent = 0
    with _connect(server) as sock:
        sock.sendall(opening)
        chunk = b"x" * (64 << 10)
        while sent < announced:
            try:
                sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            if ready_to_read([sock], [], [], 0.02)[0]:
                break
        answer = _answer(sock)
    assert answer.startswith(b"HTTP/1.1 400 "), answer[:300]
    assert b'"code":"upload_bytes_exceeded"' in answer
    # Refused at the first write past the allowance (the parser hands on 1 MiB at a time).
    assert sent < 8 << 20, sent
    assert part_keys(settings, upload_id) == []
    assert list((settings.storage_dir / ".tmp").iterdir()) == []


def test_two_parts_sent_at_once_cannot_pass_the_declared_bytes(
    server: RunningServer, http: httpx.Client, settings: Settings
) -> None:
    upload_id = _new_upload(http, 1000)
    data = b"y" * 600  # each fits alone; the two together do not
    opening, closing = _part_head(upload_id, len(data))
    temp = settings.storage_dir / ".tmp"
    with _connect(server) as one, _connect(server) as two:
        for sock in (one, two):
            sock.sendall(opening + data[:300])
        # Both are streaming (each part's writer is open) before either is recorded.
        deadline = time.monotonic() + 30
        while len(list(temp.iterdir()) if temp.exists() else []) < 2:
            assert time.monotonic() < deadline, "the parts never started"
            time.sleep(0.02)
        for sock in (one, two):
            sock.sendall(data[300:] + closing)
        answers = sorted([_answer(one), _answer(two)], key=lambda a: a[9:12])
    assert answers[0].startswith(b"HTTP/1.1 200 "), answers[0][:300]
    assert answers[1].startswith(b"HTTP/1.1 400 "), answers[1][:300]
    assert b"its parts so far hold 600, so 400 more fit; this part has 600 bytes." in answers[1]
    assert len(part_keys(settings, upload_id)) == 1
    assert list(temp.iterdir()) == []
