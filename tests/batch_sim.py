"""Test helpers for batches: input files, and a stand-in worker that follows the batch contract.

The stand-in claims shards, writes result chunks and records them exactly as the
contract tells the real worker to, so the API and the finalizer can be tested
without starting an engine.
"""

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy import select, update

from app.config import Settings
from app.core.states import BatchStatus, ShardStatus
from app.db.models import Batch, File, ResultChunk, Shard
from app.db.session import session_scope
from app.ids import new_batch_request_id, new_file_id, new_request_id
from app.services import schedule
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.files import create_file_from_storage, file_storage_key
from app.services.jsonl import iter_lines
from app.storage import storage_for
from app.storage.base import put

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"

# (custom_id, request body) → (HTTP status, response body)
Responder = Callable[[str, dict[str, Any]], tuple[int, dict[str, Any]]]


def request_line(custom_id: str, *, model: str = MODEL, url: str = CHAT, **extra: Any) -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": f"hello {custom_id}"}]}
    return orjson.dumps(
        {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}
    )


def jsonl(lines: Iterable[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in lines)


def requests_file(n: int, prefix: str = "req") -> bytes:
    return jsonl(request_line(f"{prefix}-{i}") for i in range(n))


def store_input_file(
    settings: Settings, data: bytes | Iterable[bytes], project_id: str | None = None
) -> str:
    """Registers an input file straight through the service layer; returns its id."""
    storage = storage_for(str(settings.storage_dir))
    with session_scope(settings) as session:
        project_id = project_id or ensure_project(session, DEFAULT_PROJECT).id
    file_id = new_file_id()
    chunks = [data] if isinstance(data, bytes) else data
    stored = put(storage, file_storage_key(file_id), chunks)
    with session_scope(settings) as session:
        create_file_from_storage(
            session,
            project_id=project_id,
            filename="input.jsonl",
            purpose="batch",
            stored=stored,
            expires_at=None,
            file_id=file_id,
        )
    return file_id


def load_batch(settings: Settings, batch_id: str) -> Batch:
    """The batch row as stored now, detached from its session."""
    with session_scope(settings) as session:
        batch = session.scalar(select(Batch).where(Batch.id == batch_id))
        assert batch is not None
        session.expunge(batch)
        return batch


def usage_of(custom_id: str) -> dict[str, Any]:
    n = sum(custom_id.encode()) % 17 + 3
    return {
        "prompt_tokens": n,
        "completion_tokens": n + 1,
        "total_tokens": 2 * n + 1,
        "prompt_tokens_details": {"cached_tokens": n // 2},
        "completion_tokens_details": {"reasoning_tokens": 1},
    }


def default_responder(custom_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Every seventh request fails with a 400, as an engine would refuse a bad request."""
    if sum(custom_id.encode()) % 7 == 0:
        error = {"message": "bad request", "type": "invalid_request_error", "param": None}
        return 400, {"error": {**error, "code": None}}
    return 200, {
        "id": f"chatcmpl-{custom_id}",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
        "usage": usage_of(custom_id),
    }


@dataclass
class Claim:
    shard_id: int
    batch_id: str
    epoch: int
    byte_start: int
    byte_end: int
    first_line: int
    input_key: str


def claim_shard(settings: Settings, owner: str, batch_id: str | None = None) -> Claim | None:
    """Claims a pending (or stale running) shard of an `in_progress` batch."""
    now = time.time()
    with session_scope(settings) as session:
        query = (
            select(Shard, Batch)
            .join(Batch, Batch.id == Shard.batch_id)
            .where(
                Batch.status == "in_progress",
                (Shard.status == "pending")
                | (
                    (Shard.status == "running")
                    & (Shard.heartbeat_at < now - settings.lease_seconds)
                ),
            )
            .order_by(Shard.id)
            .limit(1)
        )
        if batch_id is not None:
            query = query.where(Shard.batch_id == batch_id)
        row = session.execute(query).first()
        if row is None:
            return None
        shard, batch = row
        shard.status, shard.lease_owner = ShardStatus.RUNNING, owner
        shard.lease_epoch += 1
        shard.heartbeat_at, shard.attempts = now, shard.attempts + 1
        key = session.scalar(select(File.storage_key).where(File.id == batch.input_file_id))
        return Claim(
            shard.id,
            batch.id,
            shard.lease_epoch,
            shard.byte_start,
            shard.byte_end,
            shard.first_line,
            key or "",
        )


def write_chunk(
    settings: Settings,
    claim: Claim,
    sequence: int,
    results: list[tuple[int, dict[str, Any]]],
    *,
    done: bool,
) -> bool:
    """Stores one chunk and records it with the shard's new counts, fenced by the epoch."""
    storage = storage_for(str(settings.storage_dir))
    key = (
        f"batches/{claim.batch_id}/shards/{claim.shard_id:06d}/"
        f"{claim.epoch:06d}-{sequence:06d}.jsonl"
    )
    stored = put(storage, key, [jsonl(orjson.dumps({"line": n, "output": o}) for n, o in results)])
    sums = {"completed": 0, "failed": 0, "input": 0, "cached": 0, "output": 0, "reasoning": 0}
    for _n, output in results:
        response = output["response"]
        if response is not None and 200 <= response["status_code"] < 300:
            sums["completed"] += 1
            usage = response["body"].get("usage", {})
            sums["input"] += usage.get("prompt_tokens", 0)
            sums["output"] += usage.get("completion_tokens", 0)
            sums["cached"] += usage.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            sums["reasoning"] += usage.get("completion_tokens_details", {}).get(
                "reasoning_tokens", 0
            )
        else:
            sums["failed"] += 1
    with session_scope(settings) as session:
        values: dict[str, Any] = {
            "heartbeat_at": time.time(),
            "completed": Shard.completed + sums["completed"],
            "failed": Shard.failed + sums["failed"],
            "input_tokens": Shard.input_tokens + sums["input"],
            "cached_tokens": Shard.cached_tokens + sums["cached"],
            "output_tokens": Shard.output_tokens + sums["output"],
            "reasoning_tokens": Shard.reasoning_tokens + sums["reasoning"],
        }
        if done:
            values.update(status="done", lease_owner=None)
        result = session.execute(
            update(Shard)
            .where(Shard.id == claim.shard_id, Shard.lease_epoch == claim.epoch)
            .values(**values)
        )
        if getattr(result, "rowcount", 0) != 1:
            session.rollback()
            storage.delete(stored.key)
            return False
        session.add(
            ResultChunk(
                shard_id=claim.shard_id,
                epoch=claim.epoch,
                sequence=sequence,
                storage_key=stored.key,
                lines=len(results),
                created_at=time.time(),
            )
        )
    return True


def output_line(custom_id: str, status: int, body: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": new_batch_request_id(),
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": new_request_id(), "body": body},
        "error": None,
    }


def recorded_lines(settings: Settings, shard_id: int) -> set[int]:
    """Line numbers that already have a result in the shard's recorded chunks."""
    storage = storage_for(str(settings.storage_dir))
    with session_scope(settings) as session:
        keys = session.scalars(
            select(ResultChunk.storage_key)
            .where(ResultChunk.shard_id == shard_id)
            .order_by(ResultChunk.epoch, ResultChunk.sequence)
        ).all()
    return {orjson.loads(raw)["line"] for key in keys for _n, raw in iter_lines(storage, key)}


def run_shard(
    settings: Settings,
    claim: Claim,
    respond: Responder = default_responder,
    *,
    chunk_lines: int = 7,
    limit: int | None = None,
) -> int:
    """Runs the shard's unfinished lines in chunks of `chunk_lines`; returns lines written.

    With `limit`, stops after that many lines and leaves the shard `running`, as a
    worker that died would.
    """
    storage = storage_for(str(settings.storage_dir))
    finished = recorded_lines(settings, claim.shard_id)
    todo = [
        (line_no, raw)
        for line_no, raw in iter_lines(
            storage, claim.input_key, claim.byte_start, claim.byte_end, claim.first_line
        )
        if line_no not in finished
    ][:limit]
    complete = limit is None
    for sequence, start in enumerate(range(0, max(len(todo), 1), chunk_lines)):
        results = []
        for line_no, raw in todo[start : start + chunk_lines]:
            request = orjson.loads(raw)
            status, body = respond(request["custom_id"], request["body"])
            results.append((line_no, output_line(request["custom_id"], status, body)))
        last = start + chunk_lines >= len(todo)
        assert write_chunk(settings, claim, sequence, results, done=complete and last)
    return len(todo)


def run_batch(settings: Settings, batch_id: str, respond: Responder = default_responder) -> int:
    """Runs every shard of a batch to the end; returns how many shards it ran."""
    shards = 0
    while (claim := claim_shard(settings, "sim-worker", batch_id)) is not None:
        run_shard(settings, claim, respond)
        shards += 1
    return shards


def admitted_batch(
    settings: Settings, project: str, shards: int, *, expires_in: int = 86400, model: str = MODEL
) -> str:
    """An `in_progress` batch of `shards` one-line shards, admitted as validation admits it."""
    with session_scope(settings) as session:
        project_id = ensure_project(session, project).id
    file_id = store_input_file(settings, b"", project_id)
    now = int(time.time())
    with session_scope(settings) as session:
        batch = Batch(
            id=f"batch_{project}_{time.monotonic_ns()}",
            project_id=project_id,
            endpoint="/v1/chat/completions",
            input_file_id=file_id,
            model=model,
            completion_window="24h",
            status=BatchStatus.IN_PROGRESS,
            created_at=now,
            in_progress_at=now,
            expires_at=now + expires_in,
            total=shards,
        )
        session.add(batch)
        session.flush()
        schedule.admit(session, batch)
        session.add_all(
            Shard(
                batch_id=batch.id, index=i, first_line=i + 1, line_count=1, byte_start=0, byte_end=0
            )
            for i in range(shards)
        )
        return batch.id
