"""Validation of batch input files: the JSONL reader, bad lines, limits, shards, crashes."""

import itertools
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from sqlalchemy import select, update

from app.config import ServedModel, Settings
from app.db.models import Batch, Shard
from app.db.session import session_scope, upgrade
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.jsonl import iter_lines, scan_lines
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.storage import storage_for
from tests.batch_sim import (
    CHAT,
    MODEL,
    jsonl,
    load_batch,
    request_line,
    requests_file,
    store_input_file,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def db(settings: Settings) -> Iterator[Settings]:
    """Settings of a migrated, empty deployment (no server: the validator is called directly)."""
    settings = settings.model_copy(update={"shard_lines": 4})
    upgrade(settings.sqlalchemy_url)
    yield settings


def create(settings: Settings, data: bytes, endpoint: str = CHAT) -> str:
    file_id = store_input_file(settings, data)
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint=endpoint, completion_window="24h"
        )
        return batches.create_batch(session, settings, project_id, params).id


def shards_of(settings: Settings, batch_id: str) -> list[Shard]:
    with session_scope(settings) as session:
        rows = list(
            session.scalars(select(Shard).where(Shard.batch_id == batch_id).order_by(Shard.index))
        )
        session.expunge_all()
        return rows


def validate(settings: Settings, data: bytes, endpoint: str = CHAT) -> Batch:
    batch_id = create(settings, data, endpoint)
    assert validate_pending(settings, "test-validator") == 1
    return load_batch(settings, batch_id)


def problems(batch: Batch) -> list[tuple[str, int | None]]:
    assert batch.status == "failed", batch.status
    assert batch.failed_at is not None
    return [(e["code"], e["line"]) for e in batch.errors or []]


# --- the shared reader -----------------------------------------------------------------------


def test_scan_lines_numbers_physical_lines_and_skips_blank_ones() -> None:
    data = b'{"a":1}\n\n  \t\n{"b":2}\r\n\n{"c":3}'
    expected = [(1, 0, b'{"a":1}'), (4, 13, b'{"b":2}\r'), (6, 23, b'{"c":3}')]
    assert list(scan_lines([data])) == expected
    for size in (1, 2, 3, 5, 7):  # a line split across any chunk boundary reads the same
        chunks = [data[i : i + size] for i in range(0, len(data), size)]
        assert list(scan_lines(chunks)) == expected


def test_scan_lines_drops_a_byte_order_mark_and_reads_ranges(tmp_path: Path) -> None:
    storage = storage_for(str(tmp_path))
    from app.storage.base import put

    put(storage, "f.jsonl", [b'\xef\xbb\xbf{"a":1}\n{"b":2}\n\n{"c":3}\n'])
    assert [n for n, _ in iter_lines(storage, "f.jsonl")] == [1, 2, 4]
    assert next(iter_lines(storage, "f.jsonl")) == (1, b'{"a":1}')
    # a byte range starting mid-file keeps the physical numbering it is given
    assert list(iter_lines(storage, "f.jsonl", 19, None, 3)) == [(4, b'{"c":3}')]
    assert list(iter_lines(storage, "f.jsonl", 11, 19, 2)) == [(2, b'{"b":2}')]


# --- good files --------------------------------------------------------------------------


def test_valid_file_is_cut_into_shards_covering_whole_lines(db: Settings) -> None:
    lines = [request_line(f"r{i}") for i in range(10)]
    # blank lines between requests and a last line without a newline are fine
    data = b"\n".join(lines[:3]) + b"\n\n   \n" + b"\n".join(lines[3:])
    batch = validate(db, data)
    assert batch.status == "in_progress" and batch.in_progress_at is not None
    assert (batch.total, batch.model, batch.errors) == (10, MODEL, None)
    shards = shards_of(db, batch.id)
    assert [s.index for s in shards] == [0, 1, 2]
    assert [s.line_count for s in shards] == [4, 4, 2]
    assert [s.first_line for s in shards] == [1, 7, 11]
    assert shards[0].byte_start == 0 and shards[-1].byte_end == len(data)
    assert all(a.byte_end == b.byte_start for a, b in itertools.pairwise(shards))
    storage = storage_for(str(db.storage_dir))
    key = f"files/{batch.input_file_id}"
    seen = [
        (n, orjson.loads(raw)["custom_id"])
        for s in shards
        for n, raw in iter_lines(storage, key, s.byte_start, s.byte_end, s.first_line)
    ]
    assert [c for _, c in seen] == [f"r{i}" for i in range(10)]
    assert [n for n, _ in seen] == [1, 2, 3, *range(6, 13)]
    assert all(s.status == "pending" and s.lease_epoch == 0 for s in shards)


def test_embeddings_and_completions_endpoints_need_a_model_that_serves_them(db: Settings) -> None:
    url = "/v1/embeddings"
    line = orjson.dumps(
        {"custom_id": "e", "method": "POST", "url": url, "body": {"model": "all-MiniLM-L6-v2"}}
    )
    assert validate(db, line + b"\n", url).status == "in_progress"
    wrong = validate(db, request_line("c", url=url) + b"\n", url)
    assert problems(wrong) == [("model_endpoint_mismatch", 1)]


def test_score_and_rerank_take_their_bare_paths_and_a_pooling_model(db: Settings) -> None:
    def scoring(custom_id: str, url: str, model: str = "all-MiniLM-L6-v2") -> bytes:
        body = {"model": model, "query": "q", "documents": ["d"]}
        return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})

    mixed = scoring("a", "/score") + b"\n" + scoring("b", "/v1/score") + b"\n"
    assert validate(db, mixed, "/score").status == "in_progress"
    assert validate(db, scoring("r", "/v1/rerank") + b"\n", "/rerank").status == "in_progress"
    chat_model = scoring("c", "/v1/rerank", model="SmolLM2-135M-Instruct") + b"\n"
    assert problems(validate(db, chat_model, "/v1/rerank")) == [("model_endpoint_mismatch", 1)]
    other = validate(db, scoring("s", "/v1/score") + b"\n", "/v1/rerank")
    assert problems(other) == [("url_mismatch", 1)]


# --- bad files ---------------------------------------------------------------------------


def test_every_bad_line_kind_is_reported_with_its_line(db: Settings) -> None:
    good = request_line
    lines = [
        good("ok-1"),  # 1
        b"{not json",  # 2
        b'"a string"',  # 3
        b"\xff\xfe{}",  # 4
        orjson.dumps({"method": "POST", "url": CHAT, "body": {"model": MODEL}}),  # 5
        orjson.dumps({"custom_id": 7, "method": "POST", "url": CHAT, "body": {}}),  # 6
        good("ok-1"),  # 7
        good("m", method="GET"),  # 8
        orjson.dumps({"custom_id": "nm", "url": CHAT, "body": {"model": MODEL}}),  # 9
        good("u", url="/v1/completions"),  # 10
        orjson.dumps({"custom_id": "nb", "method": "POST", "url": CHAT}),  # 11
        orjson.dumps({"custom_id": "sb", "method": "POST", "url": CHAT, "body": "x"}),  # 12
        orjson.dumps({"custom_id": "nmo", "method": "POST", "url": CHAT, "body": {}}),  # 13
        good("other-model", model="gpt-4o"),  # 14
        good("ok-2"),  # 15
    ]
    batch = validate(db, jsonl(lines))
    assert problems(batch) == [
        ("invalid_json_line", 2),
        ("invalid_json_line", 3),
        ("invalid_utf8", 4),
        ("missing_required_parameter", 5),
        ("invalid_type", 6),
        ("duplicate_custom_id", 7),
        ("invalid_method", 8),
        ("missing_required_parameter", 9),
        ("url_mismatch", 10),
        ("missing_required_parameter", 11),
        ("invalid_type", 12),
        ("missing_required_parameter", 13),
        ("mismatched_model", 14),
    ]
    params = [e["param"] for e in batch.errors or []]
    assert params[3:6] == ["custom_id", "custom_id", "custom_id"]
    assert params[7:13] == ["method", "url", "body", "body", "body.model", "body.model"]
    assert all(e["message"] for e in batch.errors or [])
    assert batch.in_progress_at is None and shards_of(db, batch.id) == []


def test_duplicate_custom_id_reports_the_later_line(db: Settings) -> None:
    lines = [request_line(f"r{i}") for i in range(12)]
    lines[8] = request_line("r1")  # line 9 repeats line 2
    batch = validate(db, jsonl(lines))
    assert problems(batch) == [("duplicate_custom_id", 9)]
    assert "line 2" in (batch.errors or [])[0]["message"]


def test_unknown_model_is_model_not_found(db: Settings) -> None:
    batch = validate(
        db, jsonl([request_line("a", model="gpt-4o"), request_line("b", model="gpt-4o")])
    )
    assert problems(batch) == [("model_not_found", 1), ("model_not_found", 2)]
    assert MODEL in (batch.errors or [])[0]["message"]  # lists what is served


@pytest.mark.parametrize("data", [b"", b"\n\n  \n"], ids=["zero-bytes", "blank-lines"])
def test_empty_file(db: Settings, data: bytes) -> None:
    assert problems(validate(db, data)) == [("empty_file", None)]


def test_too_many_requests(db: Settings) -> None:
    limited = db.model_copy(update={"max_batch_requests": 100})
    assert validate(limited, requests_file(100)).status == "in_progress"
    batch = validate(limited, requests_file(101))
    assert problems(batch) == [("too_many_tasks", 101)]


def test_default_limit_of_50000_requests(db: Settings) -> None:
    started = time.monotonic()
    batch = validate(db.model_copy(update={"shard_lines": 1000}), requests_file(50_001))
    assert problems(batch) == [("too_many_tasks", 50_001)]
    assert time.monotonic() - started < 15


def test_file_over_the_size_limit(db: Settings) -> None:
    data = requests_file(20)
    limited = db.model_copy(update={"max_batch_file_bytes": len(data) - 1})
    batch = validate(limited, data)
    assert problems(batch) == [("file_too_large", None)]
    [error] = batch.errors or []
    assert error["param"] == "input_file_id"
    assert error["message"] == (
        f"The batch input file is {len(data):,} bytes; the limit is {len(data) - 1:,} bytes "
        "(OVERNIGHT_MAX_BATCH_FILE_BYTES)."
    )
    assert validate(db.model_copy(update={"max_batch_file_bytes": len(data)}), data).status == (
        "in_progress"
    )


def test_reported_errors_are_capped(db: Settings) -> None:
    capped = db.model_copy(update={"max_reported_errors": 5})
    batch = validate(capped, jsonl([b"nope"] * 50))
    assert problems(batch) == [("invalid_json_line", n) for n in range(1, 6)]


def test_models_come_from_the_settings_registry(db: Settings) -> None:
    custom = db.model_copy(update={"models": [ServedModel(name="my-model")]})
    assert validate(custom, jsonl([request_line("a", model="my-model")])).model == "my-model"
    assert problems(validate(custom, jsonl([request_line("b")]))) == [("model_not_found", 1)]


# --- leases, cancellation, crashes -------------------------------------------------------


def test_a_batch_cancelled_while_validating_ends_cancelled_without_files(db: Settings) -> None:
    batch_id = create(db, requests_file(10))
    with session_scope(db) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
    with session_scope(db) as session:
        assert batches.cancel_batch(session, project_id, batch_id).status == "cancelling"
    validate_pending(db, "v")  # must not write shards for a cancelled batch
    assert shards_of(db, batch_id) == []
    assert finalize_ready_batches(db, "f") == 1
    batch = load_batch(db, batch_id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    assert (batch.output_file_id, batch.error_file_id, batch.total) == (None, None, 0)


def test_a_live_validation_lease_is_respected_and_a_stale_one_taken_over(db: Settings) -> None:
    batch_id = create(db, requests_file(6))
    with session_scope(db) as session:
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(lease_owner="other", lease_epoch=1, heartbeat_at=time.time())
        )
    assert validate_pending(db, "me") == 0
    assert load_batch(db, batch_id).status == "validating"
    with session_scope(db) as session:
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(heartbeat_at=time.time() - db.lease_seconds - 1)
        )
    assert validate_pending(db, "me") == 1
    batch = load_batch(db, batch_id)
    assert (batch.status, batch.lease_epoch, batch.lease_owner) == ("in_progress", 2, None)


_SLOW_VALIDATOR = textwrap.dedent(
    """
    import sys, time
    from app.config import Settings
    from app.services.steps import validation

    real_scan = validation.scan_lines

    def slow_scan(chunks, start=0, first_line=1):
        for i, item in enumerate(real_scan(chunks, start, first_line)):
            if i == 200:
                print("HALFWAY", flush=True)
            if i >= 200:
                time.sleep(0.01)
            yield item

    validation.scan_lines = slow_scan
    validation.validate_pending(Settings(), "doomed-validator")
    print("FINISHED", flush=True)
    """
)


def test_validator_killed_mid_file_is_replaced_and_shards_are_written_once(
    db: Settings,
) -> None:
    n = 2000
    batch_id = create(db, requests_file(n))
    env = {
        **os.environ,
        "OVERNIGHT_DATABASE_URL": db.sqlalchemy_url,
        "OVERNIGHT_DATA_DIR": str(db.data_dir),
        "OVERNIGHT_SHARD_LINES": str(db.shard_lines),
        "OVERNIGHT_LEASE_SECONDS": "3",
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", _SLOW_VALIDATOR], cwd=ROOT, env=env, stdout=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == b"HALFWAY"
        time.sleep(1.2)  # long enough for at least one heartbeat
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    dead = load_batch(db, batch_id)
    assert (dead.status, dead.lease_owner, dead.lease_epoch) == (
        "validating",
        "doomed-validator",
        1,
    )
    assert shards_of(db, batch_id) == []
    fast = db.model_copy(update={"lease_seconds": 3.0})
    assert validate_pending(fast, "second") == 0  # the dead holder's lease is still live
    deadline = time.monotonic() + 10
    while validate_pending(fast, "second") == 0:
        assert time.monotonic() < deadline, "the stale lease was never taken over"
        time.sleep(0.1)
    batch = load_batch(db, batch_id)
    assert (batch.status, batch.total, batch.lease_epoch) == ("in_progress", n, 2)
    shards = shards_of(db, batch_id)
    assert len(shards) == math.ceil(n / db.shard_lines)
    assert [s.index for s in shards] == list(range(len(shards)))
    assert sum(s.line_count for s in shards) == n
    assert validate_pending(fast, "third") == 0
