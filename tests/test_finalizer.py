"""The finalizer on its own: merging chunks, fencing, takeover, expiry, usage, clean-up."""

import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from sqlalchemy import func, select, update

from app.config import Settings
from app.db.models import Batch, File, ResultChunk, Shard
from app.db.session import session_scope, upgrade
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.steps import chunk_cleanup, finalization, finalization_claim
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.storage import storage_for
from tests import batch_sim as sim


@pytest.fixture
def db(settings: Settings) -> Iterator[Settings]:
    settings = settings.model_copy(update={"shard_lines": 5, "lease_seconds": 2.0})
    upgrade(settings.sqlalchemy_url)
    yield settings


def new_batch(settings: Settings, n: int = 12, **create: Any) -> str:
    """A validated (`in_progress`) batch of `n` requests."""
    file_id = sim.store_input_file(settings, sim.requests_file(n))
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint=sim.CHAT, completion_window="24h", **create
        )
        batch_id = batches.create_batch(session, settings, project_id, params).id
    validate_pending(settings, "validator")
    assert sim.load_batch(settings, batch_id).status == "in_progress"
    return batch_id


def lines_of(settings: Settings, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    storage = storage_for(str(settings.storage_dir))
    with session_scope(settings) as session:
        key = session.scalar(select(File.storage_key).where(File.id == file_id))
    assert key
    return [orjson.loads(line) for line in b"".join(storage.read(key)).splitlines()]


def chunk_count(settings: Settings, batch_id: str) -> int:
    with session_scope(settings) as session:
        count = session.scalar(
            select(func.count(ResultChunk.id))
            .join(Shard, Shard.id == ResultChunk.shard_id)
            .where(Shard.batch_id == batch_id)
        )
        return int(count or 0)


def test_nothing_to_do_until_every_shard_is_done(db: Settings) -> None:
    batch_id = new_batch(db)
    assert finalize_ready_batches(db, "f") == 0
    claim = sim.claim_shard(db, "w", batch_id)
    assert claim is not None
    sim.run_shard(db, claim)
    assert finalize_ready_batches(db, "f") == 0
    assert sim.load_batch(db, batch_id).status == "in_progress"
    sim.run_batch(db, batch_id)
    assert finalize_ready_batches(db, "f") == 1
    assert sim.load_batch(db, batch_id).status == "completed"
    assert finalize_ready_batches(db, "f") == 0


def test_first_result_per_line_wins_and_chunks_are_removed(db: Settings) -> None:
    batch_id = new_batch(db, 5)
    first = sim.claim_shard(db, "w1", batch_id)
    assert first is not None
    sim.run_shard(db, first, limit=3, chunk_lines=2)  # lines 1-3, then the worker "dies"
    # A stale holder's duplicate of line 2 in a later chunk must not replace the first result.
    duplicate = sim.output_line("req-1", 200, {"usage": sim.usage_of("x"), "late": True})
    assert sim.write_chunk(db, first, 9, [(2, duplicate)], done=False)
    _expire_shard_lease(db, batch_id)
    second = sim.claim_shard(db, "w2", batch_id)
    assert second is not None and second.epoch == first.epoch + 1
    assert sim.run_shard(db, second) == 2  # only the two unfinished lines run again
    storage = storage_for(str(db.storage_dir))
    with session_scope(db) as session:
        keys = session.scalars(select(ResultChunk.storage_key)).all()
    assert keys and all(storage.exists(k) for k in keys)

    assert finalize_ready_batches(db, "f") == 1
    batch = sim.load_batch(db, batch_id)
    output, errors = lines_of(db, batch.output_file_id), lines_of(db, batch.error_file_id)
    every = [line["custom_id"] for line in output + errors]
    assert sorted(every) == [f"req-{i}" for i in range(5)]
    assert not any(line["response"]["body"].get("late") for line in output + errors)
    assert chunk_count(db, batch_id) == 0
    assert not any(storage.exists(k) for k in keys)
    # The chart's series outlives the chunks: all 6 recorded lines, within one second here.
    assert batch.throughput is not None
    assert sum(rate for _t, rate in batch.throughput) == 6


def _expire_shard_lease(settings: Settings, batch_id: str) -> None:
    with session_scope(settings) as session:
        session.execute(
            update(Shard)
            .where(Shard.batch_id == batch_id, Shard.status == "running")
            .values(heartbeat_at=time.time() - settings.lease_seconds - 1)
        )


def test_a_chunk_recorded_during_finalization_forces_a_retry(db: Settings) -> None:
    batch_id = new_batch(db, 6)
    claim = sim.claim_shard(db, "w", batch_id)
    assert claim is not None
    sim.run_shard(db, claim, limit=2)
    _expire_shard_lease(db, batch_id)
    with session_scope(db) as session:  # the batch expires with nobody running it
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=0))
    [(candidate, epoch)] = finalization_claim.candidates(db)
    job = finalization_claim.claim(db, candidate, epoch, "f")
    assert job is not None and job.path == "expire"
    # ...and a worker that was thought dead records one more chunk before the finalizer commits.
    assert sim.write_chunk(db, claim, 50, [(3, sim.output_line("req-2", 200, {}))], done=False)
    storage = storage_for(str(db.storage_dir))
    assert finalization.finalize(db, storage, job) is False
    assert sim.load_batch(db, batch_id).status == "in_progress"
    assert finalize_ready_batches(db, "f") == 0  # that worker renewed its lease: wait for it
    _expire_shard_lease(db, batch_id)
    assert finalize_ready_batches(db, "f") == 1
    batch = sim.load_batch(db, batch_id)
    assert batch.status == "expired" and batch.expired_at is not None
    assert (batch.completed, batch.failed) == (3, 3)
    # The late worker is fenced off now: its writes are refused.
    assert not sim.write_chunk(db, claim, 51, [(4, sim.output_line("req-3", 200, {}))], done=True)


def test_a_finalizer_that_died_is_replaced(db: Settings) -> None:
    batch_id = new_batch(db, 7)
    sim.run_batch(db, batch_id)
    with session_scope(db) as session:
        session.execute(
            update(Batch)
            .where(Batch.id == batch_id)
            .values(
                status="finalizing",
                finalizing_at=int(time.time()),
                lease_owner="dead-finalizer",
                lease_epoch=5,
                heartbeat_at=time.time(),
            )
        )
    assert finalize_ready_batches(db, "f") == 0  # its lease is still live
    with session_scope(db) as session:
        session.execute(
            update(Batch).where(Batch.id == batch_id).values(heartbeat_at=time.time() - 10)
        )
    assert finalize_ready_batches(db, "f") == 1
    batch = sim.load_batch(db, batch_id)
    assert (batch.status, batch.lease_owner, batch.lease_epoch) == ("completed", None, 6)
    assert batch.completed + batch.failed == 7


def test_a_finalizer_thought_dead_that_ends_the_batch_leaves_nothing_to_claim(db: Settings) -> None:
    batch_id = new_batch(db, 7)
    sim.run_batch(db, batch_id)
    slow = finalization_claim.claim_next(db, "slow", set())
    assert slow is not None
    with session_scope(db) as session:  # its holder froze: its lease lapsed
        session.execute(
            update(Batch).where(Batch.id == batch_id).values(heartbeat_at=time.time() - 10)
        )
    [(candidate, epoch)] = finalization_claim.candidates(db)
    # It wakes and ends the batch between another finalizer's look and that one's claim.
    assert finalization.finalize(db, storage_for(str(db.storage_dir)), slow)
    ended = sim.load_batch(db, batch_id)
    assert ended.status == "completed" and ended.completed + ended.failed == 7
    assert finalization_claim.claim(db, candidate, epoch, "late") is None
    after = sim.load_batch(db, batch_id)
    assert (after.status, after.completed, after.failed, after.output_file_id) == (
        "completed",
        ended.completed,
        ended.failed,
        ended.output_file_id,
    )
    assert finalize_ready_batches(db, "late") == 0


def test_usage_and_counts_come_from_the_written_lines(db: Settings) -> None:
    batch_id = new_batch(db, 9, output_expires_after={"anchor": "created_at", "seconds": 3600})

    def respond(custom_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        index = int(custom_id.split("-")[1])
        if index == 8:
            return 500, {"error": {"message": "engine died", "type": "server_error"}}
        usage: dict[str, Any] = {"prompt_tokens": 10, "total_tokens": 10}  # an embedding's
        if index % 2:
            usage = {
                "prompt_tokens": 5,
                "completion_tokens": 7,
                "prompt_tokens_details": {"cached_tokens": 2},
                "completion_tokens_details": {"reasoning_tokens": 3},
            }
        return 200, {"usage": usage}

    sim.run_batch(db, batch_id, respond)
    assert finalize_ready_batches(db, "f") == 1
    batch = sim.load_batch(db, batch_id)
    assert (batch.completed, batch.failed, batch.total) == (8, 1, 9)
    assert (batch.input_tokens, batch.output_tokens) == (4 * 10 + 4 * 5, 4 * 7)
    assert (batch.cached_tokens, batch.reasoning_tokens) == (4 * 2, 4 * 3)
    [error] = lines_of(db, batch.error_file_id)
    assert error["custom_id"] == "req-8" and error["response"]["status_code"] == 500
    with session_scope(db) as session:
        files = session.scalars(select(File).where(File.purpose == "batch_output")).all()
        assert {f.expires_at - f.created_at for f in files if f.expires_at} == {3600}
        assert {f.filename for f in files} == {
            f"{batch_id}_output.jsonl",
            f"{batch_id}_error.jsonl",
        }


def test_all_successes_leave_no_error_file_and_default_expiry_is_30_days(db: Settings) -> None:
    batch_id = new_batch(db, 4)
    sim.run_batch(db, batch_id, lambda cid, body: (200, {"usage": sim.usage_of(cid)}))
    assert finalize_ready_batches(db, "f") == 1
    batch = sim.load_batch(db, batch_id)
    assert batch.error_file_id is None and batch.output_file_id is not None
    with session_scope(db) as session:
        output = session.scalar(select(File).where(File.id == batch.output_file_id))
        assert output is not None and output.expires_at == output.created_at + 30 * 24 * 3600


def test_a_batch_still_validating_at_expiry_expires_without_files(db: Settings) -> None:
    file_id = sim.store_input_file(db, sim.requests_file(3))
    with session_scope(db) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint=sim.CHAT, completion_window="24h"
        )
        batch_id = batches.create_batch(session, db, project_id, params).id
    with session_scope(db) as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=0))
    assert finalize_ready_batches(db, "f") == 1
    batch = sim.load_batch(db, batch_id)
    assert (batch.status, batch.output_file_id, batch.error_file_id) == ("expired", None, None)


def test_chunks_left_by_a_finalizer_that_died_are_swept(db: Settings) -> None:
    batch_id = new_batch(db, 6)
    sim.run_batch(db, batch_id)
    storage = storage_for(str(db.storage_dir))
    with session_scope(db) as session:
        keys = session.scalars(select(ResultChunk.storage_key)).all()
    assert chunk_count(db, batch_id) > 0
    assert chunk_cleanup.delete_leftover_chunks(db, storage) == 0  # the batch is still running
    with session_scope(db) as session:  # as if it ended and its finalizer died before clean-up
        session.execute(update(Batch).where(Batch.id == batch_id).values(status="completed"))
    assert chunk_cleanup.delete_leftover_chunks(db, storage) == len(keys)
    assert chunk_count(db, batch_id) == 0 and not any(storage.exists(k) for k in keys)
