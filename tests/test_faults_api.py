"""Faults of the API process: SIGKILLed mid-upload and mid-part, then restarted.

Nothing of the interrupted body may become visible, and the client's retry must succeed.
"""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from app.config import Settings
from tests.engine_fixtures import REPO, chat_line, jsonl
from tests.harness import free_port

pytestmark = pytest.mark.faults

BOUNDARY = "overnight-faults"
CHUNK = 256 * 1024


class ApiProcess:
    """`overnight api` in a subprocess on a fixed port, so that a restart keeps the URL."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        env = {
            **os.environ,
            "OVERNIGHT_DATABASE_URL": self.settings.sqlalchemy_url,
            "OVERNIGHT_DATA_DIR": str(self.settings.data_dir),
        }
        command = [sys.executable, "-m", "app.cli", "api", "--host", "127.0.0.1"]
        log = open(self.settings.data_dir / "api.log", "ab")  # noqa: SIM115 (the child owns it)
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port)], env=env, cwd=REPO, stdout=log, stderr=log
        )
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, (self.settings.data_dir / "api.log").read_text()
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the API did not start"
            time.sleep(0.2)

    def kill(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1",
            api_key="sk-test",
            max_retries=0,
            _strict_response_validation=True,
        )


@pytest.fixture
def api(settings: Settings) -> Iterator[ApiProcess]:
    process = ApiProcess(settings)
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _form(head: bytes, data: bytes, api: ApiProcess) -> Iterator[bytes]:
    """A multipart body that kills the API halfway through the file's bytes."""
    yield head
    half = len(data) // 2
    for start in range(0, half, CHUNK):
        yield data[start : start + CHUNK]
    time.sleep(0.5)  # let the server read what was sent
    api.kill()
    for start in range(half, len(data), CHUNK):
        yield data[start : start + CHUNK]
    yield f"\r\n--{BOUNDARY}--\r\n".encode()


def _field(name: str, value: str) -> bytes:
    disposition = f'Content-Disposition: form-data; name="{name}"'
    return f"--{BOUNDARY}\r\n{disposition}\r\n\r\n{value}\r\n".encode()


def _file_head(name: str) -> bytes:
    return (
        f"--{BOUNDARY}\r\nContent-Disposition: form-data; "
        f'name="{name}"; filename="in.jsonl"\r\nContent-Type: application/jsonl\r\n\r\n'
    ).encode()


def _post_killed(api: ApiProcess, path: str, head: bytes, data: bytes) -> None:
    headers = {
        "Authorization": "Bearer sk-test",
        "Content-Type": f"multipart/form-data; boundary={BOUNDARY}",
    }
    with pytest.raises(httpx.TransportError):
        httpx.post(f"{api.url}{path}", content=_form(head, data, api), headers=headers, timeout=30)


def _data(lines: int) -> bytes:
    return jsonl([chat_line(f"u{i}") for i in range(lines)])


def test_api_killed_mid_upload_leaves_nothing_and_the_retry_succeeds(api: ApiProcess) -> None:
    data = _data(30_000)
    _post_killed(api, "/v1/files", _field("purpose", "batch") + _file_head("file"), data)
    api.start()
    with api.client() as client:
        assert client.files.list().data == [], "a half-received file is visible"
        created = client.files.create(file=("in.jsonl", data), purpose="batch")
        assert created.bytes == len(data)
        assert client.files.content(created.id).content == data
        assert [f.id for f in client.files.list().data] == [created.id]


def test_api_killed_mid_part_leaves_nothing_and_the_retry_succeeds(api: ApiProcess) -> None:
    first, second = _data(10_000), _data(20_000)[len(_data(10_000)) :]
    with api.client() as client:
        upload = client.uploads.create(
            bytes=len(first) + len(second),
            filename="in.jsonl",
            mime_type="application/jsonl",
            purpose="batch",
        )
        part_1 = client.uploads.parts.create(upload.id, data=first)
    _post_killed(api, f"/v1/uploads/{upload.id}/parts", _file_head("data"), second)
    api.start()
    with api.client() as client:
        with pytest.raises(openai.BadRequestError):
            # The killed part was never recorded: the parts sent so far are one short.
            client.uploads.complete(upload.id, part_ids=[part_1.id])
        part_2 = client.uploads.parts.create(upload.id, data=second)
        done = client.uploads.complete(upload.id, part_ids=[part_1.id, part_2.id])
        assert done.status == "completed" and done.file is not None
        assert client.files.content(done.file.id).content == first + second
        assert [f.id for f in client.files.list().data] == [done.file.id]
