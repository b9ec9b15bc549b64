"""Third-party batch clients against the real app, as their users call them.

litellm (sync and async, providers "openai" and "hosted_vllm"), instructor's `BatchProcessor`
and the `openai-batch` CLI. Batches run on the real worker loop with the scripted engine,
which answers each chat request with its last message reversed.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download at import

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import instructor.batch
import openai
import pytest
from pydantic import BaseModel

from app.config import Settings
from tests.engine_fixtures import chat_line, jsonl, wait_status
from tests.fake_engine import MODEL, FakeEngine, ThreadedWorker, fast
from tests.harness import RunningServer, running_server

# They speak HTTP only: the API answers them on both databases in the API tests.
pytestmark = pytest.mark.backends("sqlite")


@pytest.fixture(scope="module")
def litellm() -> ModuleType:
    """Imported where a test uses it, not at collection, which every xdist worker runs: the
    import takes seconds of CPU."""
    import litellm

    return litellm


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    with running_server(fast(settings)) as running:
        yield running


@pytest.fixture
def worker(server: RunningServer) -> Iterator[FakeEngine]:
    engine = FakeEngine()
    with ThreadedWorker(server.settings, engine):
        yield engine


def requests_file(tmp_path: Path, count: int = 3) -> Path:
    path = tmp_path / "requests.jsonl"
    path.write_bytes(jsonl([chat_line(f"q-{i}") for i in range(count)]))
    return path


@pytest.mark.parametrize("provider", ["openai", "hosted_vllm"])
def test_litellm_batch_calls(
    provider: str,
    litellm: ModuleType,
    server: RunningServer,
    worker: FakeEngine,
    tmp_path: Path,
    client: openai.OpenAI,
) -> None:
    where: dict[str, Any] = {
        "custom_llm_provider": provider,
        "api_base": server.base_url,
        "api_key": "sk-test",
    }
    with requests_file(tmp_path).open("rb") as f:
        uploaded = litellm.create_file(file=f, purpose="batch", **where)
    created = litellm.create_batch(
        completion_window="24h",
        endpoint="/v1/chat/completions",
        input_file_id=uploaded.id,
        metadata={"client": "litellm"},
        **where,
    )
    assert created.id.startswith("batch_") and created.metadata == {"client": "litellm"}
    wait_status(client, created.id, "completed")
    batch = litellm.retrieve_batch(batch_id=created.id, **where)
    assert batch.status == "completed" and batch.request_counts.completed == 3
    content = litellm.file_content(file_id=batch.output_file_id, **where)
    answers = sorted(line for line in content.content.decode().splitlines())
    assert len(answers) == 3 and all('"status_code":200' in a for a in answers)
    listed = litellm.list_batches(limit=10, **where)
    assert [b.id for b in listed.data] == [created.id]

    # A second batch, cancelled while its one request runs (the scripted engine waits 30 s).
    slow = tmp_path / "slow.jsonl"
    slow.write_bytes(jsonl([chat_line("slow", delay=30)]))
    with slow.open("rb") as f:
        slow_file = litellm.create_file(file=f, purpose="batch", **where)
    pending = litellm.create_batch(
        completion_window="24h",
        endpoint="/v1/chat/completions",
        input_file_id=slow_file.id,
        **where,
    )
    cancelled = litellm.cancel_batch(batch_id=pending.id, **where)
    assert cancelled.status in ("cancelling", "cancelled")
    assert wait_status(client, pending.id, "cancelled").status == "cancelled"


def test_litellm_async_batch_calls(
    litellm: ModuleType,
    server: RunningServer,
    worker: FakeEngine,
    tmp_path: Path,
    client: openai.OpenAI,
) -> None:
    where: dict[str, Any] = {
        "custom_llm_provider": "openai",
        "api_base": server.base_url,
        "api_key": "sk-test",
    }
    source = requests_file(tmp_path, count=2)

    async def flow() -> tuple[Any, Any, Any]:
        with source.open("rb") as f:
            uploaded = await litellm.acreate_file(file=f, purpose="batch", **where)
        created = await litellm.acreate_batch(
            completion_window="24h",
            endpoint="/v1/chat/completions",
            input_file_id=uploaded.id,
            **where,
        )
        await asyncio.to_thread(wait_status, client, created.id, "completed")
        batch = await litellm.aretrieve_batch(batch_id=created.id, **where)
        content = await litellm.afile_content(file_id=batch.output_file_id, **where)
        listed = await litellm.alist_batches(limit=5, **where)
        return batch, content, listed

    batch, content, listed = asyncio.run(flow())
    assert batch.status == "completed" and batch.request_counts.completed == 2
    assert len(content.content.splitlines()) == 2
    assert [b.id for b in listed.data] == [batch.id]
    # Cancelling a finished batch is OpenAI's 409, which litellm passes on.
    with pytest.raises(openai.ConflictError):
        asyncio.run(litellm.acancel_batch(batch_id=batch.id, **where))


class Person(BaseModel):
    name: str
    age: int


def test_instructor_batch_processor_flow(
    server: RunningServer,
    worker: FakeEngine,
    tmp_path: Path,
    client: openai.OpenAI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # instructor builds its own OpenAI() client from the environment.
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    processor = instructor.batch.BatchProcessor(f"openai/{MODEL}", Person)
    people = [Person(name="Ada", age=36), Person(name="Alan", age=41)]
    # The scripted engine answers a message reversed: ask for the reversed JSON.
    messages = [[{"role": "user", "content": p.model_dump_json()[::-1]}] for p in people]
    path = processor.create_batch_from_messages(messages, file_path=str(tmp_path / "in.jsonl"))
    batch_id = processor.submit_batch(path)
    assert processor.get_batch_status(batch_id)["id"] == batch_id
    wait_status(client, batch_id, "completed")
    assert processor.get_batch_status(batch_id)["request_counts"]["completed"] == 2

    results = processor.get_results(batch_id, file_path=str(tmp_path / "raw.jsonl"))
    parsed = [r.result for r in results if isinstance(r, instructor.batch.BatchSuccess)]
    assert sorted(parsed, key=lambda p: p.name) == people
    assert (tmp_path / "raw.jsonl").read_text().count("\n") == 2
    [listed] = processor.list_batches()
    assert listed.id == batch_id and listed.metadata == {"description": "Instructor batch job"}
    # The request went out with instructor's JSON schema, which the worker passed on.
    assert all(body["response_format"]["type"] == "json_schema" for body in worker.bodies())


def test_batches_without_metadata_send_null_as_openai_does(
    client: openai.OpenAI, worker: FakeEngine
) -> None:
    file_id = client.files.create(file=("a.jsonl", jsonl([chat_line("a")])), purpose="batch").id
    batch = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    raw = client.batches.with_raw_response.retrieve(batch.id).http_response.json()
    assert "metadata" in raw and raw["metadata"] is None


def openai_batch_cli(server: RunningServer, *args: str, cwd: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "openai_batch.run", "--base-url", server.base_url, *args],
        env={**os.environ, "OPENAI_API_KEY": "sk-test"},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_openai_batch_cli_create_then_resume(
    server: RunningServer, worker: FakeEngine, tmp_path: Path, client: openai.OpenAI
) -> None:
    source = requests_file(tmp_path, count=4)
    # The CLI uploads the file's bytes: the SDK names them `upload`, with no extension.
    created = openai_batch_cli(server, "--create", str(source), cwd=tmp_path)
    [batch_id] = {w.rstrip(".") for w in created.split() if w.startswith("batch_")}
    batch = wait_status(client, batch_id, "completed")
    assert client.files.retrieve(batch.input_file_id).filename == "upload"
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    openai_batch_cli(server, "--resume", batch_id, "-o", str(out), "-e", str(err), cwd=tmp_path)
    assert sorted(line.split('"custom_id":"')[1][:3] for line in out.read_text().splitlines()) == [
        f"q-{i}" for i in range(4)
    ]
