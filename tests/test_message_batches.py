"""Anthropic's Message Batches API, driven with the official `anthropic` SDK against the real app.

The API tests run batches on the real worker loop with the scripted engine, which answers
`/v1/messages` in Anthropic's shape (its text: the last message reversed), on SQLite and
PostgreSQL; crash resume runs it in worker processes (tests/fake_worker.py). On the real
vLLM engine, Message Batch results and an OpenAI batch of `/v1/messages` lines equal vLLM's
own `/v1/messages` answers (greedy): tests/test_online.py, whose SmolLM2 worker serves both.
"""

import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from anthropic.types.messages import MessageBatch, MessageBatchSucceededResult

from app.config import Settings
from app.endpoints import MESSAGES
from tests.engine_fixtures import (
    MODEL,
    FakeWorkerProcess,
    chat_line,
    jsonl,
    persisted,
    start_batch,
)
from tests.fake_engine import FakeEngine, ThreadedWorker, fast
from tests.harness import RunningServer, pauses, running_server

ADMIN_KEY = "sk-admin-message-batches"
DAY = 24 * 3600


@pytest.fixture
def server(settings: Settings, keys: dict[str, str]) -> Iterator[RunningServer]:
    with running_server(fast(settings, admin_key=ADMIN_KEY)) as running:
        yield running


@pytest.fixture
def engine(server: RunningServer) -> Iterator[FakeEngine]:
    engine = FakeEngine()
    with ThreadedWorker(server.settings, engine):
        yield engine


def sdk(server: RunningServer, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        base_url=server.url, api_key=key, max_retries=0, _strict_response_validation=True
    )


@pytest.fixture
def alpha(server: RunningServer, keys: dict[str, str]) -> Iterator[anthropic.Anthropic]:
    with sdk(server, keys["alpha"]) as client:
        yield client


def params(text: str, **extra: Any) -> dict[str, Any]:
    message = {"role": "user", "content": text}
    return {"model": MODEL, "max_tokens": 16, "messages": [message], **extra}


def requests(*texts: str, **extra: Any) -> list[Any]:
    return [{"custom_id": f"r-{i}", "params": params(t, **extra)} for i, t in enumerate(texts)]


def wait_ended(client: anthropic.Anthropic, batch_id: str, timeout: float = 60) -> MessageBatch:
    deadline = time.monotonic() + timeout
    waits = pauses()
    while (batch := client.messages.batches.retrieve(batch_id)).processing_status != "ended":
        assert time.monotonic() < deadline, f"{batch_id} still {batch.processing_status}"
        time.sleep(next(waits))
    return batch


def anthropic_error(exc: anthropic.APIStatusError) -> dict[str, Any]:
    body = exc.body
    assert isinstance(body, dict) and body["type"] == "error", body
    error: dict[str, Any] = body["error"]
    return error


def test_create_run_results_and_delete(
    alpha: anthropic.Anthropic, engine: FakeEngine, server: RunningServer, keys: dict[str, str]
) -> None:
    batch_requests = requests("hello", "world")
    no_max = {k: v for k, v in params("x").items() if k != "max_tokens"}
    batch_requests.append({"custom_id": "no-max", "params": no_max})
    created = alpha.messages.batches.create(requests=batch_requests)
    assert created.id.startswith("msgbatch_") and created.type == "message_batch"
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.request_counts.processing == 3 and created.ended_at is None
    assert (created.expires_at - created.created_at).total_seconds() == DAY

    ended = wait_ended(alpha, created.id)
    counts = ended.request_counts
    assert (counts.processing, counts.succeeded, counts.errored) == (0, 2, 1)
    assert (counts.canceled, counts.expired) == (0, 0)
    assert ended.ended_at is not None and ended.cancel_initiated_at is None
    assert ended.results_url == f"{server.url}/v1/messages/batches/{created.id}/results"

    by_id = {item.custom_id: item.result for item in alpha.messages.batches.results(created.id)}
    assert set(by_id) == {"r-0", "r-1", "no-max"}
    hello = by_id["r-0"]
    assert isinstance(hello, MessageBatchSucceededResult)
    assert hello.message.role == "assistant" and hello.message.content[0].type == "text"
    assert hello.message.content[0].text == "olleh" and hello.message.usage.output_tokens == 2
    errored = by_id["no-max"]
    assert errored.type == "errored" and errored.error.error.type == "invalid_request_error"
    assert "max_tokens" in errored.error.error.message

    # One core: the same batch is an OpenAI batch of `/v1/messages` lines.
    with openai.OpenAI(base_url=server.base_url, api_key=keys["alpha"], max_retries=0) as oai:
        same = oai.batches.retrieve(created.id)
        assert same.endpoint == MESSAGES and same.status == "completed"
        assert same.request_counts is not None and same.request_counts.completed == 2
        input_file_id = same.input_file_id

        deleted = alpha.messages.batches.delete(created.id)
        assert (deleted.id, deleted.type) == (created.id, "message_batch_deleted")
        with pytest.raises(openai.NotFoundError):
            oai.batches.retrieve(created.id)
        with pytest.raises(openai.NotFoundError):
            oai.files.retrieve(input_file_id)
    with pytest.raises(anthropic.NotFoundError) as gone:
        alpha.messages.batches.retrieve(created.id)
    assert anthropic_error(gone.value)["type"] == "not_found_error"
    with pytest.raises(anthropic.NotFoundError):
        alpha.messages.batches.delete(created.id)


def test_list_pages_with_both_cursors(
    alpha: anthropic.Anthropic, server: RunningServer, keys: dict[str, str]
) -> None:
    ids = [alpha.messages.batches.create(requests=requests(f"b{i}")).id for i in range(3)]
    oldest, middle, newest = ids
    with openai.OpenAI(base_url=server.base_url, api_key=keys["alpha"], max_retries=0) as oai:
        lines = jsonl([chat_line("c")])
        openai_batch = start_batch(oai, lines)  # an OpenAI batch is no Message Batch

    first = alpha.messages.batches.list(limit=2)
    assert [b.id for b in first.data] == [newest, middle]
    assert (first.has_more, first.first_id, first.last_id) == (True, newest, middle)
    after = alpha.messages.batches.list(limit=2, after_id=middle)
    assert [b.id for b in after.data] == [oldest] and after.has_more is False
    before = alpha.messages.batches.list(limit=1, before_id=oldest)
    assert [b.id for b in before.data] == [middle] and before.has_more is True
    newer = alpha.messages.batches.list(limit=5, before_id=middle)
    assert [b.id for b in newer.data] == [newest] and newer.has_more is False
    # The SDK's auto-pagination follows `last_id` with `after_id`.
    assert [b.id for b in alpha.messages.batches.list(limit=1)] == [newest, middle, oldest]
    assert openai_batch not in {b.id for b in alpha.messages.batches.list(limit=1000)}

    with pytest.raises(anthropic.BadRequestError) as too_many:
        alpha.messages.batches.list(limit=1001)
    assert anthropic_error(too_many.value)["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError):
        alpha.messages.batches.retrieve(openai_batch)


def test_cancel_aborts_and_ends_canceled(alpha: anthropic.Anthropic, engine: FakeEngine) -> None:
    created = alpha.messages.batches.create(requests=requests("slow", "slower", delay=60))
    deadline = time.monotonic() + 60
    while len(engine.calls) < 2:
        assert time.monotonic() < deadline, "the worker never started the requests"
        time.sleep(0.05)

    with pytest.raises(anthropic.BadRequestError) as running:
        alpha.messages.batches.delete(created.id)
    assert "still processing" in anthropic_error(running.value)["message"]
    with pytest.raises(anthropic.AnthropicError, match="results_url"):
        alpha.messages.batches.results(created.id)  # the SDK asks only once it has ended

    canceling = alpha.messages.batches.cancel(created.id)
    assert canceling.processing_status in ("canceling", "ended")
    assert canceling.cancel_initiated_at is not None
    ended = wait_ended(alpha, created.id)
    assert ended.request_counts.canceled == 2 and ended.request_counts.processing == 0
    types = [item.result.type for item in alpha.messages.batches.results(created.id)]
    assert types == ["canceled", "canceled"]
    assert len(engine.aborted) == 2  # the in-flight requests were stopped in the engine
    assert alpha.messages.batches.delete(created.id).id == created.id


def test_a_killed_workers_batch_resumes_on_a_fresh_one(
    alpha: anthropic.Anthropic, server: RunningServer
) -> None:
    """Crash resume: the worker process is SIGKILLed mid-batch, its lease lapses and a fresh
    worker ends the batch without sending any request recorded before the kill again."""
    n = 80
    first = FakeWorkerProcess(server.settings, "w-killed", ["--delay", "0.1"])
    second: FakeWorkerProcess | None = None
    try:
        first.wait_ready(timeout=60)
        created = alpha.messages.batches.create(requests=requests(*(f"m{i}" for i in range(n))))
        wait_succeeded(alpha, created.id, 8)
        os.kill(first.process.pid, signal.SIGKILL)
        first.process.wait(10)
        recorded = set(persisted(server.settings, created.id))
        assert 8 <= len(recorded) < n, "the kill came before the end of the batch"
        second = FakeWorkerProcess(server.settings, "w-fresh", ["--delay", "0.01"])
        ended = wait_ended(alpha, created.id, timeout=120)
    finally:
        for worker in (first, second):
            if worker is not None:
                worker.stop()

    found = [
        (item.custom_id, item.result.type) for item in alpha.messages.batches.results(ended.id)
    ]
    assert sorted(found) == sorted((f"r-{i}", "succeeded") for i in range(n))
    counts = ended.request_counts
    assert (counts.succeeded, counts.processing, counts.errored) == (n, 0, 0)
    assert (counts.canceled, counts.expired) == (0, 0)
    assert second is not None
    resumed = set(second.submissions(created.id))
    assert resumed, "the fresh worker ran the rest"
    assert not resumed & recorded, f"lines sent again: {sorted(resumed & recorded)[:10]}"


def wait_succeeded(client: anthropic.Anthropic, batch_id: str, at_least: int) -> None:
    deadline = time.monotonic() + 60
    while client.messages.batches.retrieve(batch_id).request_counts.succeeded < at_least:
        assert time.monotonic() < deadline, f"{batch_id}: fewer than {at_least} succeeded"
        time.sleep(0.02)


def test_errors_are_anthropics_and_keys_scope_batches(
    alpha: anthropic.Anthropic, server: RunningServer, keys: dict[str, str]
) -> None:
    created = alpha.messages.batches.create(requests=requests("mine"))
    with sdk(server, keys["beta"]) as beta:
        with pytest.raises(anthropic.NotFoundError):
            beta.messages.batches.retrieve(created.id)
        assert beta.messages.batches.list().data == []
    stranger = sdk(server, "sk-not-a-key")
    with stranger, pytest.raises(anthropic.AuthenticationError) as refused:
        stranger.messages.batches.list()
    assert anthropic_error(refused.value)["type"] == "authentication_error"
    # Anthropic's own header, as older SDKs and curl send it.
    headers = {"x-api-key": keys["alpha"], "anthropic-version": "2023-06-01"}
    with httpx.Client(timeout=60, base_url=server.url, headers=headers) as http:
        listed = http.get("/v1/messages/batches").json()
        assert [b["id"] for b in listed["data"]] == [created.id]
        empty = http.post("/v1/messages/batches", json={"requests": []})
        assert empty.status_code == 400
        assert empty.json()["error"]["type"] == "invalid_request_error"
        # Ours: before the end, the results so far (none yet), marked incomplete.
        early = http.get(f"/v1/messages/batches/{created.id}/results")
        assert early.status_code == 200 and early.text == ""
        assert early.headers["overnight-results-complete"] == "false"
        gone = http.get("/v1/messages/batches/msgbatch_nope/results")
        assert gone.status_code == 404 and gone.json()["error"]["type"] == "not_found_error"
        # The OpenAI routes keep OpenAI's error shape.
        openai_404 = http.get("/v1/batches/batch_nope", headers={"authorization": "Bearer x"})
        assert openai_404.status_code == 401 and "type" not in openai_404.json()

    twice = [*requests("a"), *requests("b")]
    with pytest.raises(anthropic.BadRequestError) as duplicate:
        alpha.messages.batches.create(requests=twice)
    assert "unique" in anthropic_error(duplicate.value)["message"]
    with pytest.raises(anthropic.BadRequestError) as unknown:
        alpha.messages.batches.create(requests=requests("x", model="no-such-model"))
    assert "no-such-model" in anthropic_error(unknown.value)["message"]
    bad_id: list[Any] = [{"custom_id": "has space", "params": params("x")}]
    with pytest.raises(anthropic.BadRequestError):
        alpha.messages.batches.create(requests=bad_id)


def test_a_refused_image_url_fails_validation_as_errored_results(
    alpha: anthropic.Anthropic,
) -> None:
    """An Anthropic image `source` URL is judged like an OpenAI `image_url` (no worker ever
    fetches a metadata address): the batch fails validation, every request `errored`."""
    image = {"type": "image", "source": {"type": "url", "url": "http://169.254.169.254/a.png"}}
    looking = params("x")
    looking["messages"] = [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}]
    batch_requests: list[Any] = [
        *requests("fine"),
        {"custom_id": "image", "params": looking},
    ]
    created = alpha.messages.batches.create(requests=batch_requests)
    ended = wait_ended(alpha, created.id)
    assert ended.request_counts.errored == 2 and ended.request_counts.processing == 0
    by_id = {item.custom_id: item.result for item in alpha.messages.batches.results(created.id)}
    refused = by_id["image"]
    assert refused.type == "errored" and "169.254.169.254" in refused.error.error.message
    assert by_id["r-0"].type == "errored"  # the batch failed as a whole, as OpenAI's does
