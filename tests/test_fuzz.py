"""Hostile input: schema-driven fuzzing of the published API, and the probes that broke it.

Whatever arrives, the answer is never a 5xx and its body is what `openapi/openapi.json`
promises (OpenAI's error envelope for every 4xx), on SQLite and PostgreSQL alike: each
generated request goes to a server on each database, so both answer the same requests and
drawing them (most of the fuzzer's time) is paid once.
"""

import json
import logging
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from app.config import Settings
from tests.forms import Part, content_type, multipart
from tests.harness import RunningServer, isolated_settings, running_server
from tests.spec import assert_error

DOCUMENT = Path(__file__).resolve().parent.parent / "openapi" / "openapi.json"
ADMIN_KEY = "sk-fuzz-admin"
AUTH = {"Authorization": f"Bearer {ADMIN_KEY}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

schema = schemathesis.openapi.from_path(str(DOCUMENT))


@contextmanager
def no_error_logged(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(caplog.handler)
    try:
        yield
    finally:
        uvicorn_errors.removeHandler(caplog.handler)
    records = [*caplog.get_records("setup"), *caplog.get_records("call")]
    errors = [r for r in records if r.levelno >= logging.ERROR]
    assert not errors, [r.getMessage() for r in errors]


def with_admin_key(settings: Settings) -> Settings:
    """An admin key, so that keys the fuzzer creates cannot close the server mid-run."""
    return settings.model_copy(update={"admin_key": ADMIN_KEY})


@pytest.fixture
def fuzzed(settings: Settings, caplog: pytest.LogCaptureFixture) -> Iterator[RunningServer]:
    """A server with an admin key; no error logged."""
    with no_error_logged(caplog), running_server(with_admin_key(settings)) as server:
        yield server


@pytest.fixture
def fuzzed_on_each_database(
    databases: list[str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> Iterator[dict[str, RunningServer]]:
    """A server with an admin key on each database of the run, by name; no error logged."""
    with no_error_logged(caplog), ExitStack() as stack:
        servers = {}
        for backend in databases:
            configured = stack.enter_context(isolated_settings(backend, tmp_path / backend))
            servers[backend] = stack.enter_context(running_server(with_admin_key(configured)))
        yield servers


@schema.parametrize()
@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_no_operation_answers_5xx_or_breaks_its_schema(
    case: schemathesis.Case, fuzzed_on_each_database: dict[str, RunningServer]
) -> None:
    for backend, server in fuzzed_on_each_database.items():
        try:
            case.call_and_validate(base_url=server.url, headers=AUTH, checks=CHECKS, timeout=30)
        except Exception as failure:
            failure.add_note(f"on {backend}")
            raise


def assert_envelope(response: httpx.Response, status: int) -> dict[str, Any]:
    error = assert_error(response, status)
    assert error["type"] == "invalid_request_error"
    return error


NUL_IDS = [
    ("GET", "/v1/files/file-%00x"),
    ("GET", "/v1/files/file-%00x/content"),
    ("DELETE", "/v1/files/file-%00x"),
    ("GET", "/v1/batches/batch_%00x"),
    ("POST", "/v1/batches/batch_%00x/cancel"),
    ("POST", "/v1/uploads/upload_%00x/parts"),
    ("POST", "/v1/uploads/upload_%00x/complete"),
    ("POST", "/v1/uploads/upload_%00x/cancel"),
    ("GET", "/v1/models/m%00"),
    ("DELETE", "/v1/admin/api_keys/key_%00"),
    ("GET", "/dashboard/batches/batch_%00x"),
    ("GET", "/dashboard/api/batches/batch_%00x"),
]
NUL_QUERIES = [
    ("/v1/files", "after"),
    ("/v1/files", "purpose"),
    ("/v1/files", "order"),
    ("/v1/files", "limit"),
    ("/v1/batches", "after"),
    ("/v1/batches", "limit"),
    ("/v1/admin/api_keys", "project"),
    ("/dashboard/files", "after"),
]
CREATE_BATCH = {
    "input_file_id": "file-x",
    "endpoint": "/v1/chat/completions",
    "completion_window": "24h",
}
NUL_BODIES = [
    ("/v1/batches", {**CREATE_BATCH, "input_file_id": "file-\x00x"}, "input_file_id"),
    ("/v1/batches", {**CREATE_BATCH, "metadata": {"k": "v\x00"}}, "metadata.k"),
    ("/v1/batches", {**CREATE_BATCH, "metadata": {"k\x00": "v"}}, "metadata"),
    ("/v1/admin/api_keys", {"project": "a\x00b"}, "project"),
    ("/v1/admin/api_keys", {"project": "p", "name": "\x00"}, "name"),
    (
        "/v1/uploads",
        {"filename": "a\x00.jsonl", "purpose": "batch", "bytes": 3, "mime_type": "text/plain"},
        "filename",
    ),
    ("/v1/uploads/upload_x/complete", {"part_ids": ["part_\x00"]}, "part_ids[0]"),
]


def test_nul_bytes_are_404_in_ids_and_400_in_parameters(fuzzed: RunningServer) -> None:
    with httpx.Client(base_url=fuzzed.url, headers=AUTH, timeout=30) as http:
        for method, path in NUL_IDS:
            assert_envelope(http.request(method, path), 404)
        for path, name in NUL_QUERIES:
            error = assert_envelope(http.get(path, params={name: "x\x00y"}), 400)
            assert error["param"] == name and error["code"] == "invalid_value"
        for path, body, param in NUL_BODIES:
            error = assert_envelope(http.post(path, json=body), 400)
            assert error["param"] == param, (path, error)
        # The form's one free-text field, the filename, refuses it as well.
        form = multipart(Part("purpose", b"batch"), Part("file", b"{}\n", b"a\x00.jsonl"))
        upload = http.post("/v1/files", content=form, headers=content_type())
        assert assert_envelope(upload, 400)["param"] == "file"


def test_long_names_separators_and_deep_json(fuzzed: RunningServer) -> None:
    long_name = "a" * 10_000 + ".jsonl"
    with httpx.Client(base_url=fuzzed.url, headers=AUTH, timeout=30) as http:
        form = http.post("/v1/files", data={"purpose": "batch"}, files={"file": (long_name, b"")})
        assert "header" in assert_envelope(form, 400)["message"]
        upload = {"filename": long_name, "purpose": "batch", "bytes": 1, "mime_type": "text/plain"}
        assert assert_envelope(http.post("/v1/uploads", json=upload), 400)["param"] == "filename"
        long_type = {**upload, "filename": "a.jsonl", "mime_type": "text/plain;" + "x" * 300}
        assert assert_envelope(http.post("/v1/uploads", json=long_type), 400)["param"] == (
            "mime_type"
        )
        # A filename is user data: separators are kept as text, never followed as a path.
        for name in ("../../etc/passwd.jsonl", "..\\..\\boot.jsonl", "/abs/x.jsonl"):
            made = http.post(
                "/v1/files", data={"purpose": "batch"}, files={"file": (name, b"{}\n")}
            )
            assert made.status_code == 200 and made.json()["filename"] == name
        for path in ("/v1/files/..%2F..%2Fetc%2Fpasswd", "/v1/files/%2E%2E", "/v1/batches/a%5Cb"):
            assert http.get(path).status_code == 404
        deep = b"[" * 100_000 + b"]" * 100_000
        for path in ("/v1/batches", "/v1/uploads", "/v1/admin/api_keys"):
            assert_envelope(http.post(path, content=deep), 400)
        assert http.get("/v1/files").status_code == 200


def _raw_exchange(server: RunningServer, request: bytes) -> bytes:
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
        return received


def test_lying_content_length(fuzzed: RunningServer) -> None:
    body = json.dumps(CREATE_BATCH).encode()
    head = f"POST /v1/batches HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_KEY}\r\n"
    # Longer than the body: the client stops sending, so nobody is there to answer.
    longer = _raw_exchange(fuzzed, f"{head}Content-Length: 5000\r\n\r\n".encode() + body)
    assert b" 500 " not in longer
    # Shorter: the server parses what was announced; the rest is no request at all.
    shorter = _raw_exchange(fuzzed, f"{head}Content-Length: 10\r\n\r\n".encode() + body)
    assert shorter.startswith(b"HTTP/1.1 400 ") and b" 500 " not in shorter
    with httpx.Client(timeout=60, base_url=fuzzed.url, headers=AUTH) as http:
        assert http.get("/v1/batches").status_code == 200
