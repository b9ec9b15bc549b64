"""Retention of stored objects: those no row names go once older than the safe age, on both
stores; rows and objects stay flat over many batches; the API's housekeeping runs it."""

import os
import time
from collections.abc import Iterator
from typing import Any

import openai
import orjson
import pytest
from sqlalchemy import func, select, update

from app.config import Settings
from app.db.models import (
    Batch,
    File,
    ResultChunk,
    Shard,
    Upload,
    UploadPart,
    WebhookDelivery,
)
from app.db.session import session_scope
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.files import create_file_from_storage
from app.services.housekeeping import tidy
from app.services.retention import retain, sweep_orphans
from app.storage import Storage, storage_for, storage_of
from app.storage.base import put
from tests import batch_sim as sim
from tests.harness import running_server
from tests.retention_sim import OWNER, Rows, ended_batch, keeping, remaining, rows_of


@pytest.fixture(params=["local", "s3"])
def store_settings(request: pytest.FixtureRequest, settings: Settings) -> Iterator[Settings]:
    if request.param == "local":
        yield settings
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    bucket = request.getfixturevalue("s3_bucket")
    yield settings.model_copy(
        update={"storage_url": f"s3://{bucket}/deploy", "s3_endpoint_url": endpoint}
    )


# Between the old objects and the fresh ones: S3 stamps them in whole seconds.
GAP = 3.0


def _named_file(settings: Settings, storage: Storage) -> str:
    """A File whose row names its object."""
    with session_scope(settings) as session:
        stored = put(storage, "files/file-named", [b'{"a": 1}\n'])
        create_file_from_storage(
            session,
            project_id=ensure_project(session, DEFAULT_PROJECT).id,
            filename="named.jsonl",
            purpose="batch",
            stored=stored,
            expires_at=None,
            file_id="file-named",
        )
    return stored.key


def _objects(storage: Storage, tag: str) -> list[str]:
    """Objects of every shape overnight writes, that no row names."""
    keys = [
        f"batches/batch_{tag}/shards/000000/000001-000000.jsonl",
        f"files/file-{tag}",
        f"uploads/upload_{tag}/part_{tag}",
        f"health/probe-{tag}",
    ]
    for key in keys:
        put(storage, key, [b"x"])
    return keys


def test_objects_no_row_names_go_once_older_than_the_safe_age(store_settings: Settings) -> None:
    settings = keeping(store_settings, retention_objects_per_pass=3)
    storage = storage_of(settings)
    named = _named_file(settings, storage)
    old = _objects(storage, "0dd0")
    foreign = ["batches/batch_x/notes.txt", "elsewhere/thing"]  # not shapes overnight writes
    for key in foreign:
        put(storage, key, [b"x"])
    old_written = time.time()
    time.sleep(GAP)
    fresh_written = time.time()
    fresh = _objects(storage, "f7e5")
    # The safe age ends between the two writes however long each pass takes.
    between = (old_written + fresh_written) / 2

    # A slice of three objects a pass: the sweep goes on where it stopped, round the store.
    for _ in range(6):
        age = time.time() - between
        sweep_orphans(settings.model_copy(update={"retention_orphan_seconds": age}), storage)

    assert [key for key in old if storage.exists(key)] == []
    assert all(storage.exists(key) for key in [named, *fresh, *foreign])


def test_the_local_sweep_lists_in_key_order_and_resumes(tmp_path: Any) -> None:
    storage = storage_for(str(tmp_path / "store"))
    keys = ["batches/a-b/x", "batches/a/y", "batches/a/z/w", "batches/b"]
    for key in keys:
        put(storage, key, [b"x"])
    assert [o.key for o in storage.scan("batches/")] == sorted(keys)
    assert [o.key for o in storage.scan("batches/", "batches/a/y")] == sorted(keys)[2:]
    stamp = os.stat(storage.path(keys[0])).st_mtime  # type: ignore[attr-defined]
    assert next(iter(storage.scan("batches/"))).modified_at == stamp


def _expire_files_of(settings: Settings, batch_id: str) -> None:
    """As if the batch's files had reached their expiry."""
    batch = sim.load_batch(settings, batch_id)
    ids = [batch.input_file_id, batch.output_file_id, batch.error_file_id]
    with session_scope(settings) as session:
        session.execute(update(File).where(File.id.in_(ids)).values(expires_at=int(time.time())))


def _table_rows(settings: Settings) -> dict[str, int]:
    tables = (Shard, ResultChunk, Upload, UploadPart, WebhookDelivery)
    with session_scope(settings) as session:
        counts = {
            t.__tablename__: session.scalar(select(func.count()).select_from(t)) or 0
            for t in tables
        }
        counts["live files"] = (
            session.scalar(select(func.count()).where(File.storage_key != "")) or 0
        )
    return counts


def test_rows_and_objects_stay_flat_over_many_batches(settings: Settings) -> None:
    settings = keeping(settings, retention_batch_rows_seconds=0.0, retention_files_seconds=0.0)
    storage = storage_of(settings)
    seen: list[tuple[dict[str, int], int]] = []
    for _ in range(50):
        batch_id = ended_batch(settings, lines=3)
        _expire_files_of(settings, batch_id)
        tidy(settings, OWNER)
        retain(settings, OWNER)
        objects = sum(1 for _o in storage.scan("batches/")) + sum(
            1 for _o in storage.scan("files/")
        )
        seen.append((_table_rows(settings), objects))
    assert seen[-1] == seen[9]
    assert all(count == 0 for count in seen[-1][0].values()) and seen[-1][1] == 0
    with session_scope(settings) as session:
        assert session.scalar(select(func.count()).select_from(Batch)) == 50  # kept, as OpenAI


def _eventually(condition: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.1)


def test_the_api_prunes_in_its_housekeeping_and_the_batch_stays_readable(
    settings: Settings,
) -> None:
    settings = keeping(
        settings,
        retention_batch_rows_seconds=0.0,
        retention_files_seconds=0.0,
        retention_orphan_seconds=1.0,
        retention_interval_seconds=0.2,
        housekeeping_interval_seconds=0.2,
        upload_ttl_seconds=2,  # an ended upload goes once past its expiry
    )
    storage = storage_of(settings)
    with (
        running_server(settings) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as client,
    ):
        upload = client.uploads.create(
            bytes=3, filename="in.jsonl", mime_type="text/jsonl", purpose="batch"
        )
        client.uploads.cancel(upload.id)
        input_file = client.files.create(file=("in.jsonl", sim.requests_file(4)), purpose="batch")
        batch = client.batches.create(
            input_file_id=input_file.id, endpoint=sim.CHAT, completion_window="24h"
        )
        _eventually(lambda: client.batches.retrieve(batch.id).status == "in_progress")
        sim.run_batch(settings, batch.id)
        _eventually(lambda: client.batches.retrieve(batch.id).status == "completed")
        orphan = put(storage, f"batches/{batch.id}/shards/000009/000001-000000.jsonl", [b"x"])

        _eventually(lambda: rows_of(settings, batch.id) == Rows(0, 0))
        _eventually(lambda: not storage.exists(orphan.key))
        _eventually(lambda: not remaining(settings, Upload.id, [upload.id]))
        ended = client.batches.retrieve(batch.id)
        assert ended.request_counts is not None and ended.request_counts.total == 4
        assert ended.output_file_id is not None
        lines = client.files.content(ended.output_file_id).text.splitlines()
        errors = (
            client.files.content(ended.error_file_id).text.splitlines()
            if ended.error_file_id
            else []
        )
        answered = sorted(orjson.loads(line)["custom_id"] for line in lines + errors)
        assert answered == [f"req-{i}" for i in range(4)]
