"""Every failure answers with OpenAI's error envelope, the right status and a request id."""

import socket
import time
from urllib.parse import urlsplit

import httpx
import openai
import pytest

from app.config import Settings
from tests.forms import BOUNDARY, Part, content_type, multipart
from tests.harness import RunningServer
from tests.spec import assert_error


def post_form(http: httpx.Client, *parts: Part, close: bool = True) -> httpx.Response:
    return http.post("/v1/files", content=multipart(*parts, close=close), headers=content_type())


def test_file_form_errors(http: httpx.Client, settings: Settings) -> None:
    good_file = Part("file", b"{}\n", filename=b"a.jsonl")
    assert_error(
        post_form(http, good_file),
        400,
        param="purpose",
        message="Missing required parameter: 'purpose'.",
    )
    assert_error(post_form(http, Part("purpose", b"batch")), 400, param="file")
    error = assert_error(post_form(http, Part("purpose", b"pets"), good_file), 400, param="purpose")
    assert "'pets'" in error["message"] and "batch" in error["message"]
    assert_error(post_form(http, Part("purpose", b"evals"), good_file), 400, param="purpose")
    wrong_ext = assert_error(
        post_form(http, Part("purpose", b"batch"), Part("file", b"{}", filename=b"a.json")), 400
    )
    assert wrong_ext == {
        "message": "Invalid file format for Batch API. Must be .jsonl",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    # The same rule when the purpose arrives after the file.
    assert_error(
        post_form(http, Part("file", b"{}", filename=b"a.csv"), Part("purpose", b"batch")),
        400,
        message="Must be .jsonl",
    )
    assert_error(
        post_form(http, Part("purpose", b"batch"), Part("file", b"{}")),  # a text field
        400,
        param="file",
        message="must be a file upload",
    )
    for seconds, anchor in (
        (b"60", b"created_at"),
        (b"2592001", b"created_at"),
        (b"x", b"created_at"),
        (b"3600", b"last_active_at"),
    ):
        assert_error(
            post_form(
                http,
                Part("purpose", b"batch"),
                Part("expires_after[anchor]", anchor),
                Part("expires_after[seconds]", seconds),
                good_file,
            ),
            400,
        )
    assert_error(
        post_form(
            http, Part("purpose", b"batch"), Part("expires_after[seconds]", b"3600"), good_file
        ),
        400,
        message="anchor",
    )
    assert_error(
        post_form(http, Part("purpose", b"batch"), good_file, good_file), 400, message="Only one"
    )
    assert list((settings.storage_dir / ".tmp").iterdir()) == []
    assert not (settings.storage_dir / "files").exists() or not any(
        (settings.storage_dir / "files").iterdir()
    )


def test_malformed_multipart(http: httpx.Client, settings: Settings) -> None:
    truncated = post_form(
        http,
        Part("purpose", b"batch"),
        Part("file", b"{}\n" * 1000, filename=b"a.jsonl"),
        close=False,
    )
    assert_error(truncated, 400, message="truncated")
    cut = multipart(Part("purpose", b"batch"), Part("file", b"{}\n" * 1000, filename=b"a.jsonl"))
    assert_error(http.post("/v1/files", content=cut[:1500], headers=content_type()), 400)
    assert_error(
        http.post("/v1/files", content=b"garbage", headers=content_type()), 400, message="Malformed"
    )
    assert_error(
        http.post(
            "/v1/files",
            content=b"--" + BOUNDARY.encode() + b"\r\nX-Nothing: 1\r\n\r\nabc\r\n",
            headers=content_type(),
        ),
        400,
        message="Content-Disposition",
    )
    assert_error(
        http.post("/v1/files", json={"purpose": "batch"}), 400, message="multipart/form-data"
    )
    assert_error(
        http.post("/v1/files", content=b"", headers={"Content-Type": "multipart/form-data"}),
        400,
        message="boundary",
    )
    assert_error(http.post("/v1/files"), 400)
    too_long_field = post_form(http, Part("purpose", b"b" * 70_000))
    assert_error(too_long_field, 400, param="purpose")
    assert list((settings.storage_dir / ".tmp").iterdir()) == []


def test_unknown_ids(http: httpx.Client) -> None:
    for method, path, param in (
        ("GET", "/v1/files/file-nope", "id"),
        ("GET", "/v1/files/file-nope/content", "id"),
        ("DELETE", "/v1/files/file-nope", "id"),
        ("POST", "/v1/uploads/upload_nope/parts", "upload_id"),
        ("POST", "/v1/uploads/upload_nope/complete", "upload_id"),
        ("POST", "/v1/uploads/upload_nope/cancel", "upload_id"),
    ):
        body: dict[str, list[str]] | None = {"part_ids": []} if path.endswith("complete") else None
        response = http.request(method, path, json=body)
        error = assert_error(response, 404, param=param)
        assert error["message"].startswith("No such ")


def test_list_parameters(http: httpx.Client) -> None:
    for limit, code in (("0", "integer_below_min_value"), ("10001", "integer_above_max_value")):
        error = assert_error(http.get("/v1/files", params={"limit": limit}), 400, param="limit")
        assert error["code"] == code
    assert http.get("/v1/files", params={"limit": 10000}).status_code == 200
    assert http.get("/v1/files", params={"limit": 1}).status_code == 200
    assert_error(http.get("/v1/files", params={"limit": "ten"}), 400, param="limit")
    assert_error(http.get("/v1/files", params={"order": "sideways"}), 400, param="order")
    assert_error(http.get("/v1/files", params={"after": "file-nope"}), 400, param="after")


def test_routing_errors(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing-here"), 404, message="Invalid URL")
    assert_error(http.get("/nope"), 404)
    assert_error(http.put("/v1/files"), 405)
    assert_error(http.get("/v1/uploads/upload_x/cancel"), 405)
    assert_error(http.patch("/v1/files/file-x"), 405)


def test_sdk_sees_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as not_found:
        client.files.retrieve("file-missing")
    assert not_found.value.request_id is not None
    assert not_found.value.request_id.startswith("req_")
    with pytest.raises(openai.BadRequestError) as bad:
        client.files.create(file=("a.txt", b"x"), purpose="batch")
    assert bad.value.body == {
        "message": "Invalid file format for Batch API. Must be .jsonl",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    with pytest.raises(openai.BadRequestError):
        client.files.list(limit=0)
    with pytest.raises(openai.NotFoundError):
        client.uploads.cancel("upload_missing")


def test_client_disconnect_leaves_nothing(server: RunningServer, settings: Settings) -> None:
    body = multipart(Part("purpose", b"batch"), Part("file", b"x" * 4_000_000, filename=b"a.jsonl"))
    head = (
        f"POST /v1/files HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n\r\n"
    )
    tmp = settings.storage_dir / ".tmp"
    with socket.create_connection((urlsplit(server.url).hostname, urlsplit(server.url).port)) as s:
        s.sendall(head.encode() + body[: len(body) // 2])
        deadline = time.monotonic() + 10
        while not any(tmp.iterdir()):  # the writer is open: the upload is under way
            assert time.monotonic() < deadline
            time.sleep(0.01)
    deadline = time.monotonic() + 10
    while any(tmp.iterdir()):
        assert time.monotonic() < deadline, list(tmp.iterdir())
        time.sleep(0.01)
    assert not (settings.storage_dir / "files").exists() or not any(
        (settings.storage_dir / "files").iterdir()
    )
