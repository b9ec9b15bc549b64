"""Helpers of the retention tests: small batches on the scripted path, in their states."""

import time
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import func, select, update

from app.config import Settings
from app.core.states import BatchStatus
from app.db.models import Batch, File, ResultChunk, Shard, WebhookEndpoint
from app.db.session import session_scope
from app.schemas.batches import CreateBatchRequest
from app.services import batches, monitoring
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.jsonl import iter_lines
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from app.storage import Storage
from tests import batch_sim as sim

DAY = 24 * 3600.0
OWNER = "retention-test"


def keeping(settings: Settings, **ages: Any) -> Settings:
    """Settings that keep everything a day, unless `ages` say otherwise."""
    values = {
        "retention_batch_rows_seconds": DAY,
        "retention_deliveries_seconds": DAY,
        "retention_workers_seconds": DAY,
        "retention_files_seconds": DAY,
        "retention_orphan_seconds": DAY,
        "served_model_memory_seconds": 0.0,
        **ages,
    }
    return settings.model_copy(update=values)


def project_id(settings: Settings) -> str:
    with session_scope(settings) as session:
        return ensure_project(session, DEFAULT_PROJECT).id


def validated_batch(settings: Settings, lines: int = 5, prefix: str = "req") -> str:
    """An `in_progress` batch of `lines` requests."""
    file_id = sim.store_input_file(settings, sim.requests_file(lines, prefix))
    params = CreateBatchRequest(input_file_id=file_id, endpoint=sim.CHAT, completion_window="24h")
    with session_scope(settings) as session:
        batch_id = batches.create_batch(session, settings, project_id(settings), params).id
    validate_pending(settings, OWNER)
    return batch_id


def ended_batch(settings: Settings, lines: int = 5) -> str:
    batch_id = validated_batch(settings, lines)
    sim.run_batch(settings, batch_id)
    finalize_ready_batches(settings, OWNER)
    assert sim.load_batch(settings, batch_id).status == BatchStatus.COMPLETED
    return batch_id


def running_batch(settings: Settings) -> str:
    """A batch with one shard half run: recorded chunks, not finalized."""
    batch_id = validated_batch(settings, lines=12)
    claim = sim.claim_shard(settings, "sim-worker", batch_id)
    assert claim is not None
    sim.run_shard(settings, claim, chunk_lines=3, limit=6)
    return batch_id


@dataclass(frozen=True)
class Rows:
    shards: int
    chunks: int


def rows_of(settings: Settings, batch_id: str) -> Rows:
    shards = select(Shard.id).where(Shard.batch_id == batch_id)
    with session_scope(settings) as session:
        return Rows(
            session.scalar(select(func.count()).select_from(shards.subquery())) or 0,
            session.scalar(select(func.count()).where(ResultChunk.shard_id.in_(shards))) or 0,
        )


def chunk_keys(settings: Settings, batch_id: str) -> list[str]:
    with session_scope(settings) as session:
        return list(
            session.scalars(
                select(ResultChunk.storage_key)
                .join(Shard, Shard.id == ResultChunk.shard_id)
                .where(Shard.batch_id == batch_id)
            )
        )


def age_batch(settings: Settings, batch_id: str, seconds: float) -> None:
    """Moves the batch's times `seconds` into the past, as if it had run then."""
    moved = {
        name: getattr(Batch, name) - seconds
        for name in ("created_at", "in_progress_at", "completed_at", "cancelling_at")
    }
    with session_scope(settings) as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(moved))


def totals(settings: Settings) -> monitoring.Totals:
    with session_scope(settings) as session:
        return monitoring.totals(session)


def custom_ids_of(storage: Storage, settings: Settings, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    with session_scope(settings) as session:
        key = session.scalar(select(File.storage_key).where(File.id == file_id))
    assert key
    return [orjson.loads(raw)["custom_id"] for _n, raw in iter_lines(storage, key)]


def remaining(settings: Settings, column: Any, values: list[str]) -> set[str]:
    with session_scope(settings) as session:
        return set(session.scalars(select(column).where(column.in_(values))))


def subscribed_endpoint(settings: Settings) -> str:
    """A webhook endpoint of the default project, subscribed to `batch.completed`."""
    now = int(time.time())
    endpoint = WebhookEndpoint(
        id="we_retention",
        project_id=project_id(settings),
        name="retention",
        url="https://example.com/hook",
        event_types=["batch.completed"],
        enabled=True,
        secret="whsec_test",
        created_at=now,
        updated_at=now,
    )
    with session_scope(settings) as session:
        session.add(endpoint)
    return endpoint.id
