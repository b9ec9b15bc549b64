"""A worker that switches models by demand (`overnight worker --models A,B`).

The rule is tested alone (when to leave a model), the demand query on both databases (which
model's work a claim would serve first), and the whole on the real engine: one worker runs a
SmolLM2 batch and a MiniLM batch, switching between them, never in the middle of a shard,
and goes on serving them when a third model's engine cannot start.
"""

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import select

from app.config import ServedModel, Settings
from app.core.schedule import Order
from app.core.states import BatchStatus
from app.core.switching import SwitchRule, wait_for
from app.db.models import Batch, BatchSchedule, RegisteredWorker
from app.db.session import session_scope
from app.endpoints import CHAT, EMBEDDINGS, GENERATIVE, POOLING
from app.schemas.models import ANNOUNCEMENT_KEY, SWITCHING_KEY, Announcement, StandbyModel
from app.services import schedule
from tests.batch_sim import admitted_batch
from tests.engine_fixtures import (
    ENGINE_ARGS,
    MODEL,
    deployment,
    jsonl,
    line,
    results,
    shards_of,
    start_batch,
    wait_status,
)
from tests.harness import PRODUCT_LEASE_SECONDS
from tests.reference_llm import REFERENCE_CHATS
from worker import registry
from worker.claim import models_with_work
from worker.switching import Switches

EMBEDDER = "all-MiniLM-L6-v2"
BROKEN = "broken-embedder"


# -- when to leave a model --


def test_a_model_with_work_is_held_for_its_residency() -> None:
    rule = SwitchRule(min_residency=60)
    leave = rule.should_leave
    assert not leave("a", ["b", "a"], held_for=59, switch_seconds=10, holding_work=True)
    assert leave("a", ["b", "a"], held_for=60, switch_seconds=10, holding_work=True)
    # Loading the next model costs 30 s: hold at least 4x that, so switching stays under 20%.
    assert not leave("a", ["b", "a"], held_for=110, switch_seconds=30, holding_work=True)
    assert leave("a", ["b", "a"], held_for=120, switch_seconds=30, holding_work=True)


def test_an_idle_model_is_left_at_once_and_a_first_one_kept() -> None:
    rule = SwitchRule(min_residency=600)
    leave = rule.should_leave
    assert leave("a", ["b"], held_for=0, switch_seconds=30, holding_work=False)
    assert not leave("a", ["a", "b"], held_for=10_000, switch_seconds=0, holding_work=True)
    assert not leave("a", [], held_for=10_000, switch_seconds=0, holding_work=False)


# -- which model's work comes first --


def test_models_with_work_come_in_the_order_a_claim_serves_them(
    client: openai.OpenAI, settings: Settings
) -> None:
    chat = [line("c-1", CHAT, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})]
    embed = [line("e-1", EMBEDDINGS, {"model": EMBEDDER, "input": "a sentence"})]
    first = start_batch(client, jsonl(embed), EMBEDDINGS)
    start_batch(client, jsonl(chat), CHAT)
    wait_status(client, first, "in_progress")
    deadline = time.monotonic() + 60
    while True:  # the second batch validates in the background too
        with session_scope(settings) as session:
            found = models_with_work(session, [MODEL, EMBEDDER, "other"], settings.lease_seconds)
            only_chat = models_with_work(session, [MODEL], settings.lease_seconds)
        if len(found) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    # No worker yet: the older batch's model comes first (fair share ties, then age).
    assert found == [EMBEDDER, MODEL]
    assert only_chat == [MODEL]


def test_the_wait_for_a_model_not_held_is_the_residency_left_and_its_load() -> None:
    shown = Switches(["a", "b", "c"], 60.0, {"a": 20.0, "b": 10.0}).shown("a")
    assert wait_for(shown, "a", held_for=5, holding_work=True) == 0.0
    assert wait_for(shown, "b", held_for=5, holding_work=True) == 55 + 10
    assert wait_for(shown, "b", held_for=5, holding_work=False) == 10
    # c never loaded: the dearest measured load stands for it; a residency of 4 x 20 s.
    assert wait_for(shown, "c", held_for=5, holding_work=True) == 75 + 20
    assert wait_for(shown, "d", held_for=5, holding_work=False) is None


def test_the_planner_expects_a_model_when_a_switching_worker_would_load_it(
    settings: Settings,
) -> None:
    """model-b ran at 2 work/s half an hour ago; no worker runs it now, a switching worker
    holding the idle model-a would load it in 10 s."""
    now = time.time()
    ended = admitted_batch(settings, "p", 0, model="model-b")
    waiting = admitted_batch(settings, "p", 4, model="model-b")
    with session_scope(settings) as session:
        batch = session.scalars(select(Batch).where(Batch.id == ended)).one()
        batch.status, batch.completed_at = BatchStatus.COMPLETED, int(now - 1790)
        batch.total = batch.completed = 40
        clock = session.get(BatchSchedule, ended)
        assert clock is not None
        clock.work_done = 40
        batch.throughput = [(now - 1800, 2.0), (now - 1790, 2.0)]
        estimates = {e.batch_id: e for e in schedule.replan(session, Order.FAIR, now)}
    assert waiting not in estimates  # no worker serves model-b: no estimate
    loads = {"model-a": 30.0, "model-b": 10.0}
    shown = Switches(["model-a", "model-b"], 60.0, loads).shown("model-a")
    with session_scope(settings) as session:
        registry.register(session, "switcher", "model-a", {SWITCHING_KEY: shown})
    with session_scope(settings) as session:
        estimates = {e.batch_id: e for e in schedule.replan(session, Order.FAIR, now)}
    # 4 requests of work 1 each at 2/s, after the 10 s load.
    assert estimates[waiting].start_at == pytest.approx(now + 10, abs=0.01)
    assert estimates[waiting].finish_at == pytest.approx(now + 12, abs=0.01)


# -- what the API and the dashboard make of a switching worker --


def test_a_switching_workers_models_are_served_and_shown(
    client: openai.OpenAI, http: httpx.Client, settings: Settings
) -> None:
    """Its row as the switcher writes it while it loads model-b, model-a held before."""
    standby = [
        StandbyModel(name="model-a", endpoints=list(GENERATIVE)),
        StandbyModel(name="model-b"),
    ]
    switches = Switches(["model-a", "model-b"], 60.0, {"model-a": 20.6, "model-b": 13.4}, 1, 13.4)
    row = {
        ANNOUNCEMENT_KEY: Announcement(names=[], endpoints=[], standby=standby).model_dump(),
        SWITCHING_KEY: switches.shown("model-b"),
    }
    with session_scope(settings) as session:
        registry.loading(session, "switcher-1", "model-b", time.time(), row)
    listed = endpoints_listed(client)
    assert listed["model-a"] == GENERATIVE and listed["model-b"] == []
    # model-b's endpoints are not known before it is first held: its batches are taken.
    body = {"model": "model-b", "input": "a sentence"}
    batch_id = start_batch(client, jsonl([line("b-1", EMBEDDINGS, body)]), EMBEDDINGS)
    assert wait_status(client, batch_id, "in_progress", "failed").status == "in_progress"
    page = http.get("/dashboard/workers/switcher-1").text
    assert "holds model-b of model-a, model-b by demand; 1 switch, 13s switching" in page
    assert "loads in model-a 21s, model-b 13s" in page


# -- one worker, two models, on the real engine --


def endpoints_listed(client: openai.OpenAI) -> dict[str, list[str]]:
    raw = client.get("/models", cast_to=object)
    assert isinstance(raw, dict)
    return {m["id"]: m["endpoints"] for m in raw["data"]}


def test_sleep_mode_asked_for_where_vllm_has_none_falls_back_to_restarts(
    models_data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from worker.cli import parse

    settings = Settings(data_dir=models_data_dir, _env_file=None)  # type: ignore[call-arg]
    argv = ["--models", f"{MODEL}, {EMBEDDER}", "--enable-sleep-mode", "--max-model-len", "2048"]
    args, _ = parse(argv, settings)
    assert list(args.choices) == [MODEL, EMBEDDER]
    # One --max-model-len, each model at most its own (MiniLM's is 256 tokens).
    assert [a.max_model_len for a in args.choices.values()] == [2048, 256]
    assert args.choices[EMBEDDER].runner == "pooling"
    assert args.enable_sleep_mode is False  # this CPU: vLLM has no sleep mode here
    assert "a switch restarts the engine" in caplog.text


@pytest.mark.engine
@pytest.mark.backends("sqlite")
@pytest.mark.parametrize("switch", ["restart", "sleep"])
def test_one_worker_serves_several_models_switching_between_shards(
    tmp_path: Path,
    backend: str,
    switch: str,
    smollm2: Path,
    reference: Callable[[], list[str]],
) -> None:
    from vllm.platforms import current_platform

    sleeps = current_platform.is_sleep_mode_available()
    if switch == "sleep" and not sleeps:
        pytest.skip("vLLM has no sleep mode on this platform (CPU): switches restart engines")
    import torch
    from safetensors.torch import save_file

    from worker.models import minilm_dir

    # MiniLM's config with none of its weights: its engine fails to start (at weight loading).
    broken = shutil.copytree(minilm_dir(), tmp_path / "broken")
    save_file({"unrelated": torch.zeros(1)}, str(broken / "model.safetensors"))
    # MiniLM is not listed: it is served because the worker announces it, unloaded.
    listed = [
        ServedModel(name=MODEL, endpoints=list(GENERATIVE), source=str(smollm2)),
        ServedModel(name=BROKEN, endpoints=list(POOLING), source=str(broken)),
    ]
    # A shard run twice after a lapse would read as a switch in the middle of a shard.
    data_dir = tmp_path / "deployment"
    with deployment(
        backend, data_dir, models=listed, lease_seconds=PRODUCT_LEASE_SECONDS
    ) as running:
        env: dict[str, str | None] = {
            "OVERNIGHT_MODELS": json.dumps([m.model_dump() for m in listed])
        }
        args = ["--models", f"{MODEL},{EMBEDDER},{BROKEN}", "--min-residency", "0"]
        args += ["--enable-sleep-mode"] if switch == "sleep" else []
        worker = running.start_worker("switcher", [*args, *ENGINE_ARGS], env)
        worker.wait_ready()
        client = running.client()
        assert EMBEDDER in endpoints_listed(client)

        # SmolLM2 is held and idle: a batch for the broken model makes the worker try it;
        # its engine fails, the model is paused, its batch waits and SmolLM2 is not lost.
        body = {"model": BROKEN, "input": "never embedded"}
        waiting = start_batch(client, jsonl([line("b-1", EMBEDDINGS, body)]), EMBEDDINGS)
        deadline = time.monotonic() + 300
        while f"could not load {BROKEN}" not in worker.tail(1_000_000):
            assert time.monotonic() < deadline and worker.process.poll() is None, worker.tail()
            time.sleep(0.5)

        # The embeddings batch makes the worker load MiniLM.
        texts = [f"sentence number {i}" for i in range(40)]
        embeds = [
            line(f"e-{i}", EMBEDDINGS, {"model": EMBEDDER, "input": t}) for i, t in enumerate(texts)
        ]
        embedded = start_batch(client, jsonl(embeds), EMBEDDINGS)
        batch = wait_status(client, embedded, "completed", "failed", timeout=300)
        assert batch.status == "completed", worker.tail()
        for answer in results(client, batch).values():
            body = answer["response"]["body"]
            assert body["model"] == EMBEDDER and len(body["data"][0]["embedding"]) == 384

        # Now MiniLM is held and idle: the chat batch brings SmolLM2 back.
        chats = [
            line(f"c-{i}", CHAT, {"model": MODEL, **chat, "temperature": 0})
            for i, chat in enumerate(REFERENCE_CHATS)
        ]
        chatted = start_batch(client, jsonl(chats), CHAT)
        batch = wait_status(client, chatted, "completed", "failed", timeout=300)
        assert batch.status == "completed", worker.tail()
        answers = results(client, batch)
        said = [
            answers[f"c-{i}"]["response"]["body"]["choices"][0]["message"]["content"]
            for i in range(len(REFERENCE_CHATS))
        ]
        assert said == reference()  # as vLLM's own LLM.chat answers on SmolLM2 alone

        assert client.batches.retrieve(waiting).status == "in_progress"
        # Never in the middle of a shard: every shard ran once, under one lease.
        for batch_id in (embedded, chatted):
            assert {s.attempts for s in shards_of(running.settings, batch_id)} == {1}
        with session_scope(running.settings) as session:
            row = session.get(RegisteredWorker, "switcher")
            assert row is not None and row.model == MODEL
            shown = (row.engine_configuration or {})[SWITCHING_KEY]
        # SmolLM2 → MiniLM → SmolLM2 (the failed start is no switch).
        assert shown["switches"] == 2 and set(shown["load_seconds"]) == {MODEL, EMBEDDER}
        # Both models' endpoints are known now, each from the engine that served it.
        endpoints = endpoints_listed(client)
        assert endpoints[MODEL] == GENERATIVE and endpoints[EMBEDDER] == POOLING
        log = worker.tail(1_000_000)
        if switch == "sleep":
            assert f"putting {MODEL} to sleep" in log and f"waking {MODEL}" in log
        else:
            assert f"stopping {MODEL}'s engine" in log
