"""Served names register themselves: a worker's `--served-model-name` is listed by `/v1/models`
and accepted by batch validation, for the endpoints its engine serves.

The fast tests write `workers` rows as a worker's registry does (no engine) and use the API as
a user would; the last test starts a real MiniLM worker under a name of its own.
"""

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import update

from app.config import Settings
from app.db.models import RegisteredWorker
from app.db.session import session_scope
from app.endpoints import CHAT, EMBEDDINGS, GENERATIVE, POOLING
from app.schemas.models import ANNOUNCEMENT_KEY
from tests.engine_fixtures import (
    deployment,
    jsonl,
    line,
    results,
    start_batch,
    wait_status,
)
from tests.harness import running_server
from worker import registry

EMBEDDER = "my-embedder"
LISTED = ["SmolLM2-135M-Instruct", "all-MiniLM-L6-v2"]


def announce(
    settings: Settings,
    worker_id: str,
    names: list[str],
    endpoints: list[str],
    adapters: list[dict[str, str]] | None = None,
) -> None:
    """A ready worker's row, as `worker.registry.register` writes it for a vLLM engine."""
    served = {"names": names, "endpoints": endpoints, "adapters": adapters or []}
    configuration = {ANNOUNCEMENT_KEY: served}
    with session_scope(settings) as session:
        registry.register(session, worker_id, names[0], configuration)


def age(settings: Settings, worker_id: str, seconds: float) -> None:
    """The worker was last heard from `seconds` ago."""
    with session_scope(settings) as session:
        session.execute(
            update(RegisteredWorker)
            .where(RegisteredWorker.id == worker_id)
            .values(heartbeat_at=time.time() - seconds)
        )


def models(client: openai.OpenAI) -> dict[str, list[str]]:
    """Model id → endpoints, as `GET /v1/models` lists them."""
    raw = client.get("/models", cast_to=object)
    assert isinstance(raw, dict)
    return {m["id"]: m["endpoints"] for m in raw["data"]}


def embedding_batch(client: openai.OpenAI, model: str = EMBEDDER) -> str:
    body = {"model": model, "input": "a sentence"}
    return start_batch(client, jsonl([line("e-1", EMBEDDINGS, body)]), EMBEDDINGS)


def chat_batch(client: openai.OpenAI, model: str) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return start_batch(client, jsonl([line("c-1", CHAT, body)]), CHAT)


def refusal(client: openai.OpenAI, batch_id: str) -> tuple[str, str]:
    """The (code, message) of the one error that failed the batch at validation."""
    batch = wait_status(client, batch_id, "failed", "in_progress")
    assert batch.status == "failed", batch
    [error] = batch.errors.data if batch.errors and batch.errors.data else [None]
    assert error is not None and error.line == 1 and error.param == "body.model", batch
    return str(error.code), str(error.message)


def accepted(client: openai.OpenAI, batch_id: str) -> bool:
    return wait_status(client, batch_id, "failed", "in_progress").status == "in_progress"


# --- fast: workers rows, no engine ------------------------------------------------------------


def test_an_announced_name_is_listed_and_its_batches_are_taken(
    client: openai.OpenAI, settings: Settings
) -> None:
    assert list(models(client)) == LISTED
    announce(settings, "embedder-1", [EMBEDDER, "alias"], POOLING)
    listed = models(client)
    assert list(listed) == [*LISTED, "alias", EMBEDDER]
    assert listed[EMBEDDER] == listed["alias"] == POOLING
    found = client.models.retrieve(EMBEDDER)
    assert (found.id, found.object, found.owned_by) == (EMBEDDER, "model", "overnight")
    assert EMBEDDER in [m.id for m in client.models.list()]
    assert accepted(client, embedding_batch(client))
    code, message = refusal(client, chat_batch(client, EMBEDDER))
    assert code == "model_endpoint_mismatch"
    assert CHAT in message and EMBEDDINGS in message


def test_a_model_no_worker_serves_is_refused_by_name(
    client: openai.OpenAI, settings: Settings
) -> None:
    code, message = refusal(client, embedding_batch(client, "nobody-serves-this"))
    assert code == "model_not_found"
    assert "'nobody-serves-this'" in message
    assert "no worker serves it" in message and "OVERNIGHT_MODELS" in message
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nobody-serves-this")


def test_a_restarting_workers_name_is_served_until_its_memory_lapses(
    client: openai.OpenAI, settings: Settings
) -> None:
    announce(settings, "embedder-1", [EMBEDDER], POOLING)
    with session_scope(settings) as session:
        registry.stopped(session, "embedder-1")  # restarting: the new one not up yet
    assert models(client)[EMBEDDER] == POOLING
    assert accepted(client, embedding_batch(client))
    age(settings, "embedder-1", settings.served_model_memory_seconds + 60)
    assert EMBEDDER not in models(client)
    assert refusal(client, embedding_batch(client))[0] == "model_not_found"


def test_a_loading_worker_serves_its_name_before_its_endpoints_are_known(
    client: openai.OpenAI, settings: Settings
) -> None:
    with session_scope(settings) as session:
        registry.loading(session, "embedder-1", EMBEDDER, time.time())
    assert models(client)[EMBEDDER] == []
    # Its engine decides the endpoints: until then any line waits for it.
    assert accepted(client, chat_batch(client, EMBEDDER))
    age(settings, "embedder-1", settings.lease_seconds + 5)  # it died while loading
    assert EMBEDDER not in models(client)
    assert refusal(client, embedding_batch(client))[0] == "model_not_found"


def test_a_listed_models_endpoints_follow_its_workers(
    client: openai.OpenAI, settings: Settings
) -> None:
    announce(settings, "minilm-1", ["all-MiniLM-L6-v2"], [EMBEDDINGS])
    assert list(models(client)) == LISTED
    assert models(client)["all-MiniLM-L6-v2"] == [EMBEDDINGS]
    assert models(client)["SmolLM2-135M-Instruct"] == GENERATIVE


@pytest.fixture
def pinned(settings: Settings) -> Iterator[openai.OpenAI]:
    with (
        running_server(settings.model_copy(update={"pin_models": True})) as server,
        openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0) as sdk,
    ):
        yield sdk


def test_pinned_models_are_the_listed_ones_only(pinned: openai.OpenAI, settings: Settings) -> None:
    announce(settings, "embedder-1", [EMBEDDER], POOLING)
    announce(settings, "minilm-1", ["all-MiniLM-L6-v2"], [EMBEDDINGS])
    assert models(pinned) == {"SmolLM2-135M-Instruct": GENERATIVE, "all-MiniLM-L6-v2": POOLING}
    code, message = refusal(pinned, embedding_batch(pinned))
    assert code == "model_not_found" and "OVERNIGHT_PIN_MODELS" in message
    assert "'my-embedder'" in message


def test_the_dashboard_shows_what_each_worker_serves(
    http: httpx.Client, settings: Settings
) -> None:
    announce(settings, "embedder-1", [EMBEDDER, "alias"], POOLING)
    with session_scope(settings) as session:
        registry.loading(session, "loading-1", "next-model", time.time())
    rows = {r["id"]: r for r in http.get("/dashboard/api/workers").json()["rows"]}
    assert rows["embedder-1"]["model"] == f"{EMBEDDER}, alias"
    assert rows["embedder-1"]["endpoints"] == ", ".join(POOLING)
    assert (rows["loading-1"]["model"], rows["loading-1"]["endpoints"]) == ("next-model", "—")
    page = http.get("/dashboard/workers").text
    assert f"{EMBEDDER}, alias" in page and ", ".join(POOLING) in page


# --- the real engine: a MiniLM worker under a name of its own ---------------------------------


@pytest.mark.engine
@pytest.mark.backends("sqlite")
def test_a_worker_under_its_own_name_serves_batches(tmp_path: Path, backend: str) -> None:
    from worker.models import minilm_dir

    with deployment(backend, tmp_path / "deployment") as running:
        args = [str(minilm_dir()), "--served-model-name", EMBEDDER, "--runner", "pooling"]
        worker = running.start_worker("embedder", [*args, "--enforce-eager"])
        worker.wait_ready()
        client = running.client()
        listed = {m.id: m for m in client.models.list()}
        assert EMBEDDER in listed
        assert models(client)[EMBEDDER] == POOLING
        texts = ["the cat sat", "a dog ran", "rain fell"]
        lines = [
            line(f"e-{i}", EMBEDDINGS, {"model": EMBEDDER, "input": t}) for i, t in enumerate(texts)
        ]
        batch_id = start_batch(client, jsonl(lines), EMBEDDINGS)
        batch = wait_status(client, batch_id, "completed", "failed", timeout=300)
        assert batch.status == "completed", batch
        answers = results(client, batch)
        assert set(answers) == {"e-0", "e-1", "e-2"}
        for answer in answers.values():
            body = answer["response"]["body"]
            assert answer["response"]["status_code"] == 200 and body["model"] == EMBEDDER
            assert len(body["data"][0]["embedding"]) == 384
