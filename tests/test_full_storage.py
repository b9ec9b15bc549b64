"""A full store: uploads get OpenAI's error (507 storage_full) and leave nothing; a running
batch waits for space with its lease kept and renewed, then finishes with nothing lost or run
twice.

The local store is a real 1 MiB tmpfs (mounted by the test, so it needs root, as CI has);
an S3 store refusing writes answers as MinIO does when its drives are full.
"""

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from botocore.awsrequest import AWSResponse

from app.config import Settings
from app.storage import storage_of
from app.storage.s3 import S3Storage
from tests.engine_fixtures import (
    chat_line,
    jsonl,
    results,
    shards_of,
    start_batch,
    wait_status,
)
from tests.fake_engine import FakeEngine, ThreadedWorker, fast
from tests.harness import PRODUCT_LEASE_SECONDS, RunningServer, running_server
from tests.spec import assert_error

pytestmark = [
    pytest.mark.faults,
    pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root"),
]


@contextlib.contextmanager
def small_filesystem(path: Path, size: str = "1m") -> Iterator[Path]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path: Path) -> Path:
    """Takes every free byte of the filesystem at `path`; delete the file to give them back."""
    filler = path / "filler"
    with contextlib.suppress(OSError), filler.open("wb") as f:
        while True:
            f.write(b"\0" * 65536)
            f.flush()
    return filler


@pytest.fixture
def full_store(settings: Settings) -> Iterator[tuple[RunningServer, Path]]:
    with (
        small_filesystem(settings.storage_dir) as store,
        running_server(
            fast(settings, shard_lines=5, lease_seconds=PRODUCT_LEASE_SECONDS)
        ) as server,
    ):
        yield server, store


def wait_for(condition: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def sdk(server: RunningServer) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server.base_url, api_key="k", max_retries=0, _strict_response_validation=True
    )


def renewed_since(
    server: RunningServer, batch_id: str, held: dict[int, tuple[int, float]], seconds: float
) -> bool:
    """Every shard is still running under the lease `held` names, renewed `seconds` later."""
    shards = shards_of(server.settings, batch_id)
    return all(
        s.status == "running"
        and s.lease_epoch == held[s.id][0]
        and (s.heartbeat_at or 0.0) >= held[s.id][1] + seconds
        for s in shards
    )


def leftovers(store: Path) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if p.is_file())


def test_uploads_to_a_full_store_are_507_and_leave_nothing(
    full_store: tuple[RunningServer, Path],
) -> None:
    server, store = full_store
    client = sdk(server)
    big = b'{"a": "' + b"x" * 1_500_000 + b'"}\n'
    with pytest.raises(openai.APIStatusError) as info:
        client.files.create(file=("big.jsonl", big), purpose="batch")
    assert info.value.status_code == 507
    error = assert_error(info.value.response, 507)
    assert error["code"] == "storage_full" and "storage is full" in error["message"]
    assert info.value.response.headers["x-should-retry"] == "false"

    upload = client.uploads.create(
        bytes=len(big), filename="big.jsonl", mime_type="application/jsonl", purpose="batch"
    )
    with pytest.raises(openai.APIStatusError) as info:
        client.uploads.parts.create(upload_id=upload.id, data=big)
    assert info.value.status_code == 507
    assert client.files.list().data == []
    assert leftovers(store) == []
    # The refused bytes were given back: a file that fits is stored.
    small = client.files.create(file=("small.jsonl", b"{}\n"), purpose="batch")
    assert client.files.content(small.id).content == b"{}\n"


def test_a_batch_waits_for_space_and_loses_nothing(
    full_store: tuple[RunningServer, Path],
) -> None:
    server, store = full_store
    client = sdk(server)
    lines = [chat_line(f"r{i}") for i in range(12)]
    engine = FakeEngine(delay=0.01)
    batch_id = start_batch(client, jsonl(lines))
    wait_status(client, batch_id, "in_progress", timeout=30)
    filler = fill(store)
    with ThreadedWorker(server.settings, engine) as worker:
        wait_for(lambda: len(engine.calls) == 12)
        held = {
            s.id: (s.lease_epoch, s.heartbeat_at or 0.0)
            for s in shards_of(server.settings, batch_id)
        }
        assert len(held) == 3
        # The worker goes on renewing each shard's lease (the database's clock) while its
        # results wait: a second of renewals past the last call, every lease its first.
        wait_for(lambda: renewed_since(server, batch_id, held, seconds=1.0))
        assert worker.exit_code is None
        waiting = client.batches.retrieve(batch_id)
        assert waiting.status == "in_progress"
        assert waiting.request_counts is not None and waiting.request_counts.completed == 0
        filler.unlink()
        batch = wait_status(client, batch_id, "completed", timeout=60)
    assert worker.exit_code == 0
    by_id = results(client, batch)
    assert sorted(by_id) == sorted(f"r{i}" for i in range(12))
    assert len(engine.calls) == 12  # nothing ran twice


def _refuse_writes(request: Any, **_kwargs: Any) -> AWSResponse | None:
    """MinIO's answer to a write when its drives are full."""
    if request.method not in ("PUT", "POST"):
        return None
    body = (
        b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>XMinioStorageFull</Code>"
        b"<Message>Storage backend has reached its minimum free drive threshold.</Message>"
        b"</Error>"
    )
    return AWSResponse(request.url, 507, {"Content-Type": "application/xml"}, _Raw(body))


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **_kwargs: Any) -> Iterator[bytes]:
        yield self.body


def test_an_s3_store_refusing_writes_is_507(
    settings: Settings, s3_endpoint: str, s3_bucket: str
) -> None:
    settings = settings.model_copy(
        update={"storage_url": f"s3://{s3_bucket}", "s3_endpoint_url": s3_endpoint}
    )
    storage = storage_of(settings)
    assert isinstance(storage, S3Storage)
    events = storage.client.meta.events
    with running_server(settings) as server, httpx.Client(timeout=60, base_url=server.url) as http:
        events.register_first("before-send.s3", _refuse_writes)
        try:
            refused = http.post(
                "/v1/files", data={"purpose": "batch"}, files={"file": ("a.jsonl", b"{}\n")}
            )
            assert assert_error(refused, 507)["code"] == "storage_full"
        finally:
            events.unregister("before-send.s3", _refuse_writes)
        assert http.get("/v1/files").json()["data"] == []
        stored = http.post(
            "/v1/files", data={"purpose": "batch"}, files={"file": ("a.jsonl", b"{}\n")}
        )
        assert stored.status_code == 200
