"""Helpers shared by the worker tests: input lines, waiting on batches, reading result files."""

import time
from collections.abc import Callable
from typing import Any

import openai
import orjson
from sqlalchemy import select

from app.config import Settings
from app.db.models import Shard
from app.db.session import session_scope

MODEL = "SmolLM2-135M-Instruct"
CHAT = "/v1/chat/completions"


def chat_line(custom_id: str, content: str = "", model: str = MODEL, **body: Any) -> bytes:
    messages = [{"role": "user", "content": content or f"hello {custom_id}"}]
    request = {"model": model, "messages": messages, **body}
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": CHAT, "body": request})


def line(custom_id: str, url: str, body: dict[str, Any]) -> bytes:
    return orjson.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def jsonl(lines: list[bytes]) -> bytes:
    return b"".join(item + b"\n" for item in lines)


def start_batch(
    client: openai.OpenAI, data: bytes, endpoint: str = CHAT, name: str = "in.jsonl"
) -> str:
    file_id = client.files.create(file=(name, data, "application/jsonl"), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
    )
    return batch.id


def wait_until(
    client: openai.OpenAI,
    batch_id: str,
    done: Callable[[openai.types.Batch], bool],
    timeout: float = 60,
    interval: float = 0.05,
) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        assert time.monotonic() < deadline, f"{batch_id} still {batch.status}: {batch}"
        time.sleep(interval)


def wait_status(
    client: openai.OpenAI, batch_id: str, *statuses: str, timeout: float = 60
) -> openai.types.Batch:
    return wait_until(client, batch_id, lambda b: b.status in statuses, timeout)


def file_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(raw) for raw in client.files.content(file_id).content.splitlines()]


def results(client: openai.OpenAI, batch: openai.types.Batch) -> dict[str, dict[str, Any]]:
    """Every output and error line by custom_id; asserts each appears exactly once."""
    lines = file_lines(client, batch.output_file_id) + file_lines(client, batch.error_file_id)
    by_id = {item["custom_id"]: item for item in lines}
    assert len(by_id) == len(lines), "a custom_id appears more than once"
    return by_id


def shards_of(settings: Settings, batch_id: str) -> list[Shard]:
    with session_scope(settings) as session:
        rows = list(session.scalars(select(Shard).where(Shard.batch_id == batch_id)))
        session.expunge_all()
        return rows
