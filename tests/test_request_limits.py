"""Bodies the server will not hold (too large, stalled) and methods no route takes."""

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from app.config import Settings
from tests.forms import JSON_TYPE
from tests.harness import RunningServer, read_http_message, readable, running_server
from tests.spec import assert_error

LIMIT = 64 * 1024


@pytest.fixture
def limited(settings: Settings) -> Iterator[RunningServer]:
    update = {
        "max_json_body_bytes": LIMIT,
        "body_idle_timeout_seconds": 1.0,
        "header_timeout_seconds": 1.0,
    }
    with running_server(settings.model_copy(update=update)) as server:
        yield server


def _connect(server: RunningServer) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=10)


@pytest.mark.parametrize("path", ["/v1/batches", "/v1/uploads", "/v1/admin/api_keys"])
def test_a_json_body_past_the_limit_is_refused_while_it_streams(
    limited: RunningServer, path: str
) -> None:
    with _connect(limited) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )
        sent = 0
        chunk = b'{"k": "' + b"x" * 65_000 + b'"}'
        frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
        # Up to 1 GiB if the server kept reading: it must answer long before.
        while sent < 1 << 30:
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(chunk)
            # Past the limit, wait a little for the answer before sending more.
            if readable(sock, 0.05 if sent > LIMIT else 0):
                break
        answer = read_http_message(sock)
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b'"code":"request_too_large"' in answer
    assert sent < 16 * LIMIT


def test_a_declared_length_past_the_limit_is_refused_at_once(limited: RunningServer) -> None:
    with httpx.Client(timeout=60, base_url=limited.url) as http:
        big = b'{"project": "' + b"p" * LIMIT + b'"}'
        error = assert_error(http.post("/v1/admin/api_keys", content=big, headers=JSON_TYPE), 413)
        assert error["code"] == "request_too_large"
        assert error["message"] == (
            "The request body is 65.6 kB; the limit is 65.5 kB (OVERNIGHT_MAX_JSON_BODY_BYTES)."
        )
        small = http.post("/v1/admin/api_keys", json={"project": "p"})
        assert small.status_code == 200


def test_a_stalled_body_is_ended_and_its_connection_closed(limited: RunningServer) -> None:
    with _connect(limited) as sock:
        sock.sendall(
            b"POST /v1/batches HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"a": '
        )
        started = time.monotonic()
        answer = read_http_message(sock)
        assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
        assert b"\r\nconnection: close\r\n" in answer.lower(), answer[:400]
        assert time.monotonic() - started < 9  # a 1 s timeout, on a loaded 2-core machine
        sock.settimeout(5)
        while sock.recv(65536):
            pass  # the server closes the connection: recv returns b""


@pytest.mark.parametrize(
    "sent", [b"", b"GET /v1/files HTTP/1.1\r\nHost: x\r\n", b"GET /v1/files HTTP/1.1\r\n"]
)
def test_a_trickled_request_head_is_closed(limited: RunningServer, sent: bytes) -> None:
    with _connect(limited) as sock:
        sock.sendall(sent)
        started = time.monotonic()
        while time.monotonic() - started < 5:
            try:
                sock.sendall(b"X-Slow: 1\r\n" if sent else b"")
            except (BrokenPipeError, ConnectionResetError):
                break
            sock.settimeout(0.3)
            try:
                if sock.recv(65536) == b"":
                    break
            except TimeoutError:
                continue
        assert time.monotonic() - started < 4.5, "the connection was never closed"
    # A request sent whole on a fresh connection is served as usual.
    with httpx.Client(timeout=60, base_url=limited.url) as http:
        assert http.get("/v1/files").status_code == 200


def test_an_unsupported_method_is_405_with_allow(http: httpx.Client) -> None:
    for method, path, allowed in (
        ("TRACE", "/v1/files", "GET, POST"),
        ("PUT", "/v1/batches/batch_x", "GET"),
        ("PATCH", "/v1/admin/api_keys/key_x", "DELETE"),
    ):
        response = http.request(method, path)
        assert_error(response, 405)
        assert response.headers["allow"] == allowed
