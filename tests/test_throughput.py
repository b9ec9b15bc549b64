"""Throughput is defined once and shows the same in the CLI, the dashboard and `/metrics`."""

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from app.cli import main
from app.config import Settings
from app.core.throughput import batch_throughput
from app.db.models import Batch
from app.db.session import session_scope
from tests import batch_sim
from tests.harness import RunningServer, running_server

ADMIN_KEY = "sk-admin-throughput"
OUTPUT_TOKENS = 1000


@dataclass
class Timeline:
    endpoint: str
    in_progress_at: int | None = 100
    finalizing_at: int | None = None
    cancelled_at: int | None = None
    expired_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None


def test_generation_counts_output_tokens_over_running_time() -> None:
    ended = Timeline("/v1/chat/completions", finalizing_at=150, completed_at=900)
    rate = batch_throughput(ended, 10_000, input_tokens=9_000, output_tokens=500, completed=5)
    assert (rate.per_second, rate.unit, str(rate)) == (10.0, "tok/s", "10.0 tok/s")
    running = Timeline("/v1/responses")
    assert (
        batch_throughput(running, 200, input_tokens=1, output_tokens=50, completed=1).per_second
        == 0.5
    )


def test_embeddings_count_input_tokens_or_inputs() -> None:
    batch = Timeline("/v1/embeddings", completed_at=120)
    tokens = batch_throughput(batch, 999, input_tokens=400, output_tokens=0, completed=8)
    assert (tokens.per_second, tokens.unit) == (20.0, "input tok/s")
    inputs = batch_throughput(batch, 999, input_tokens=0, output_tokens=0, completed=8)
    assert (inputs.per_second, inputs.unit) == (0.4, "inputs/s")


def test_not_started_is_zero() -> None:
    batch = Timeline("/v1/chat/completions", in_progress_at=None)
    assert (
        batch_throughput(batch, 999, input_tokens=5, output_tokens=5, completed=1).per_second == 0
    )


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    shown = {"admin_key": ADMIN_KEY, "metrics_per_batch": True}  # /metrics names the batch
    with running_server(settings.model_copy(update=shown)) as running:
        yield running


def long_answers(custom_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    usage = {"prompt_tokens": 7, "completion_tokens": OUTPUT_TOKENS, "total_tokens": 1007}
    message = {"role": "assistant", "content": "long"}
    return 200, {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message}],
        "usage": usage,
    }


def test_cli_dashboard_and_metrics_agree(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    sdk = openai.OpenAI(base_url=server.base_url, api_key=ADMIN_KEY, max_retries=0)
    f = sdk.files.create(file=("in.jsonl", batch_sim.requests_file(6)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 30
    while sdk.batches.retrieve(batch.id).status != "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    claim = batch_sim.claim_shard(server.settings, "sim", batch.id)
    assert claim is not None
    batch_sim.run_shard(server.settings, claim, long_answers, limit=3)
    # 3 requests of 1000 output tokens over 1000 s of running: 3.0 output tokens/s.
    with session_scope(server.settings) as session:
        since = int(time.time()) - 1000
        session.execute(update(Batch).where(Batch.id == batch.id).values(in_progress_at=since))

    main(["batches", "show", batch.id, "--base-url", server.base_url, "--api-key", ADMIN_KEY])
    assert "3.0 tok/s" in capsys.readouterr().out

    browser = httpx.Client(base_url=server.url, timeout=30)
    browser.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard"})
    assert browser.get("/dashboard/api/batches").json()["rows"][0]["throughput"] == "3.0 tok/s"
    assert browser.get(f"/dashboard/api/batches/{batch.id}").json()["throughput"] == "3.0 tok/s"
    assert (
        'data-field="throughput">3.0 tok/s<' in browser.get(f"/dashboard/batches/{batch.id}").text
    )

    exposition = httpx.get(f"{server.url}/metrics").text
    (family,) = (
        f
        for f in text_string_to_metric_families(exposition)
        if f.name == "overnight_batch_throughput"
    )
    (sample,) = family.samples
    assert sample.labels == {"batch": batch.id, "model": batch_sim.MODEL, "unit": "tok/s"}
    assert sample.value == pytest.approx(3.0, abs=0.05)
