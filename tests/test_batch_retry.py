"""Retrying what failed: unrun and 5xx requests (4xx with `all`) make a new batch; the two
outputs together hold every custom_id once."""

from typing import Any

import openai
import orjson
import pytest

from app.cli import main
from app.config import Settings
from tests import batch_sim as sim
from tests.engine_fixtures import wait_status
from tests.harness import RunningServer, running_server

N = 12


@pytest.fixture
def server(settings: Settings) -> Any:
    fast = settings.model_copy(update={"shard_lines": 5, "housekeeping_interval_seconds": 0.2})
    with running_server(fast) as running:
        yield running


def error(status: int, kind: str) -> tuple[int, dict[str, Any]]:
    return status, {"error": {"message": kind, "type": kind, "param": None, "code": None}}


def first_run(custom_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """req-1 meets a dying engine (500), req-3 a refusal (400), the rest succeed."""
    if custom_id == "req-1":
        return error(500, "server_error")
    if custom_id == "req-3":
        return error(400, "invalid_request_error")
    return always_ok(custom_id, body)


def always_ok(_custom_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    return sim.default_responder("ok", body)


def custom_ids(client: openai.OpenAI, file_id: str | None) -> list[str]:
    if file_id is None:
        return []
    content = client.files.content(file_id).content
    return [orjson.loads(raw)["custom_id"] for raw in content.splitlines()]


def test_retry_runs_what_can_change_and_the_outputs_cover_every_request_once(
    server: RunningServer, client: openai.OpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = server.settings
    f = client.files.create(file=("in.jsonl", sim.requests_file(N)), purpose="batch")
    original = client.batches.create(
        input_file_id=f.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"team": "ml"},
        extra_body={"output_expires_after": {"anchor": "created_at", "seconds": 7200}},
    ).id
    wait_status(client, original, "in_progress")
    claim = sim.claim_shard(settings, "sim", original)
    assert claim is not None and claim.first_line == 1
    sim.run_shard(settings, claim, first_run)  # requests 0-4; the other shards never run
    client.batches.cancel(original)
    done = wait_status(client, original, "cancelled")

    refused = {"req-3"}
    expected = {"req-1"} | {f"req-{i}" for i in range(5, N)}

    retry = client.post(f"/batches/{original}/retry", body={}, cast_to=openai.types.Batch)
    assert retry.metadata == {"team": "ml", "retry_of": original}
    # Its output files expire as the original's would.
    assert sim.load_batch(settings, retry.id).output_expires_after == 7200
    retried = wait_status(client, retry.id, "in_progress")
    assert retried.request_counts is not None and retried.request_counts.total == len(expected)
    sim.run_batch(settings, retry.id, always_ok)
    finished = wait_status(client, retry.id, "completed")
    assert sorted(custom_ids(client, finished.input_file_id)) == sorted(expected)

    outputs = custom_ids(client, done.output_file_id) + custom_ids(client, finished.output_file_id)
    assert sorted(outputs + sorted(refused)) == sorted(f"req-{i}" for i in range(N))
    assert len(set(outputs)) == len(outputs)

    # The CLI, with --all: the refused requests too.
    args = ["batches", "retry", original, "--all", "--base-url", server.base_url]
    assert main([*args, "--api-key", "sk-test"]) == 0
    printed = capsys.readouterr().out.split()
    everything = wait_status(client, printed[0], "in_progress")
    assert everything.request_counts is not None
    assert everything.request_counts.total == len(expected | refused)

    # A batch that is still running, or has nothing retryable, is a clear error.
    with pytest.raises(openai.BadRequestError, match="no failed request to retry"):
        client.post(f"/batches/{retry.id}/retry", body={}, cast_to=openai.types.Batch)
    with pytest.raises(openai.ConflictError, match="wait until it ends"):
        client.post(f"/batches/{everything.id}/retry", body={}, cast_to=openai.types.Batch)
    with pytest.raises(openai.NotFoundError):
        client.post("/batches/batch_nope/retry", body={}, cast_to=openai.types.Batch)
