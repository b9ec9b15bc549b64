"""End to end on the real vLLM CPU engine: SDK upload → batch → API validator → worker → finalizer.

One SQLite deployment (API server + a SmolLM2 worker + a MiniLM worker, both in the dtype the
worker's rule picks) serves most tests, the picked dtype's checks among them; PostgreSQL gets a
deployment with two workers sharing one batch. Engine starts are the cost here (~30 s each on
2 cores), so every engine is started once and shared.
"""

import base64
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import update

from app.db.models import Batch, RegisteredWorker
from app.db.session import session_scope
from app.schemas.batches import CreateBatchRequest
from app.services.auth import ensure_project
from app.services.batches import create_batch
from tests.batch_sim import load_batch, store_input_file
from tests.engine_fixtures import (
    CHAT,
    ENGINE_ENV,
    MODEL,
    REPO,
    Deployment,
    chat_line,
    child_env,
    deployment,
    file_lines,
    jsonl,
    line,
    results,
    smollm2_args,
    start_batch,
    wait_completed,
    wait_status,
)
from tests.harness import PRODUCT_LEASE_SECONDS, free_port
from tests.reference_embeddings import SENTENCES
from tests.reference_llm import REFERENCE_CHATS
from worker.dtype import FLOAT32, worker_dtype

pytestmark = pytest.mark.engine

COMPLETIONS = "/v1/completions"
EMBEDDINGS = "/v1/embeddings"
RESPONSES = "/v1/responses"
MINILM = "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def local(
    smollm2: Path, reference: Callable[[], list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    with deployment("sqlite", tmp_path_factory.mktemp("sqlite")) as running:
        # vLLM 0.32 serves any tool_choice but "none" only with these, as `vllm serve` does.
        tools = ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
        running.start_worker("chat-1", [*smollm2_args(smollm2), *tools])
        online = ["--online-port", str(free_port())]
        running.start_worker("minilm", ["--model", "bundled:minilm", "--enforce-eager", *online])
        running.workers["chat-1"].wait_ready()
        yield running


def test_chat_batch_equals_vllm_offline(
    local: Deployment, reference: Callable[[], list[str]]
) -> None:
    lines = [
        chat_line(f"chat-{i}", model=MODEL, temperature=0, **{k: v for k, v in chat.items()})
        for i, chat in enumerate(REFERENCE_CHATS)
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines))
        batch = wait_status(client, batch_id, "completed", timeout=180)
        by_id = results(client, batch)
    assert batch.request_counts is not None
    assert (batch.request_counts.total, batch.request_counts.completed) == (5, 5)
    expected = reference()
    # The bundled model in the dtype the worker picks on this machine still knows its capitals.
    assert "Paris" in by_id["chat-0"]["response"]["body"]["choices"][0]["message"]["content"]
    for i, text in enumerate(expected):
        item = by_id[f"chat-{i}"]
        assert item["error"] is None
        assert item["id"].startswith("batch_req_")
        response = item["response"]
        assert response["status_code"] == 200 and response["request_id"].startswith("req_")
        body = response["body"]
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert body["choices"][0]["message"]["content"] == text
    usage = batch.usage
    assert usage is not None
    bodies = [by_id[f"chat-{i}"]["response"]["body"]["usage"] for i in range(5)]
    assert usage.output_tokens == sum(u["completion_tokens"] for u in bodies)
    assert usage.input_tokens == sum(u["prompt_tokens"] for u in bodies)


def test_engine_gauges_reach_metrics_and_the_log_is_one_json_stream(local: Deployment) -> None:
    """vLLM's scheduler stats go through the heartbeat to the API's /metrics; the worker's
    output (vLLM's own lines and its engine process's included) is JSON lines only."""
    worker = ("worker", "chat-1")
    lines = [chat_line(f"g{i}", max_tokens=48, ignore_eos=True) for i in range(24)]
    seen: dict[str, float] = {}
    with local.client() as client, httpx.Client(timeout=60, base_url=local.server.url) as http:
        batch_id = start_batch(client, jsonl(lines))
        deadline = time.monotonic() + 180
        while client.batches.retrieve(batch_id).status != "completed":
            assert time.monotonic() < deadline, f"{batch_id} did not complete"
            for family in text_string_to_metric_families(http.get("/metrics").text):
                for sample in family.samples:
                    if dict(sample.labels).get("worker") == worker[1]:
                        seen[sample.name] = max(seen.get(sample.name, 0.0), sample.value)
            time.sleep(0.2)
    assert seen["overnight_worker_engine_running_requests"] > 0
    assert 0 < seen["overnight_worker_kv_cache_usage_ratio"] <= 1
    with session_scope(local.settings) as session:
        row = session.get(RegisteredWorker, "chat-1")
        assert row is not None and row.engine_configuration is not None
        effective = row.engine_configuration["effective"]
    assert effective["max_model_len"] == 2048 and effective["kv_cache_tokens"] > 0
    assert row.engine_configuration["arguments"]["enforce_eager"] is True

    records = [
        orjson.loads(raw) for raw in local.workers["chat-1"].log_path.read_bytes().splitlines()
    ]
    vllm = [r for r in records if r["logger"].startswith("vllm")]
    assert vllm, "vLLM's lines are in the stream"
    assert {"EngineCore"} <= {r.get("process") for r in vllm}
    assert {r["level"] for r in vllm} <= {"warning", "error", "critical"}
    assert any(r["logger"] == "overnight.worker" for r in records)


def test_completions_batch(local: Deployment) -> None:
    lines = [
        line(
            f"c-{i}",
            COMPLETIONS,
            {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "logprobs": 2},
        )
        for i, prompt in enumerate(["The capital of France is", "1, 2, 3,", "Once upon a time"])
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines), endpoint=COMPLETIONS)
        batch = wait_status(client, batch_id, "completed", timeout=120)
        by_id = results(client, batch)
    for i in range(3):
        body = by_id[f"c-{i}"]["response"]["body"]
        assert body["object"] == "text_completion"
        choice = body["choices"][0]
        assert (
            choice["text"]
            and len(choice["logprobs"]["top_logprobs"]) == body["usage"]["completion_tokens"]
        )
        assert body["usage"]["completion_tokens"] <= 8


def test_cached_tokens_of_a_shared_system_prompt(local: Deployment) -> None:
    """vLLM's prefix cache serves the shared prompt; the batch's usage sums what it reports."""
    system = " ".join(f"Rule {i}: answer briefly and politely." for i in range(80))
    lines = [
        line(
            f"s-{i}",
            CHAT,
            {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"Say the number {i}."},
                ],
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        for i in range(12)
    ]
    with local.client() as client:
        batch = wait_status(client, start_batch(client, jsonl(lines)), "completed", timeout=180)
        bodies = [r["response"]["body"] for r in results(client, batch).values()]
    per_line = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in bodies]
    assert batch.usage is not None
    assert batch.usage.input_tokens_details.cached_tokens == sum(per_line) > 0
    assert sum(per_line) <= batch.usage.input_tokens


def test_valid_and_invalid_requests_mixed(local: Deployment) -> None:
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    lines = [
        chat_line("plain", max_tokens=8, temperature=0),
        chat_line("too-long", max_tokens=5000),
        chat_line("bad-type", max_tokens=8, temperature="hot"),
        chat_line("stream", max_tokens=8, stream=True),
        chat_line("n-two", max_tokens=6, n=2, seed=7, temperature=0.8),
        chat_line("logprobs", max_tokens=4, temperature=0, logprobs=True, top_logprobs=2),
        chat_line(
            "json",
            "Which city is the capital of France? Answer in JSON.",
            max_tokens=40,
            temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
        ),
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines))
        batch = wait_status(client, batch_id, "completed", timeout=180)
        by_id = results(client, batch)
        errors = file_lines(client, batch.error_file_id)
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (4, 3)
    assert {e["custom_id"] for e in errors} == {"too-long", "bad-type", "stream"}
    for item in errors:
        assert item["error"] is None
        assert item["response"]["status_code"] == 400
        assert set(item["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    assert by_id["too-long"]["response"]["body"]["error"]["param"] == "max_tokens"
    assert len(by_id["n-two"]["response"]["body"]["choices"]) == 2
    assert by_id["logprobs"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    content = by_id["json"]["response"]["body"]["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content)["city"], str)


def test_responses_batch(local: Deployment, reference: Callable[[], list[str]]) -> None:
    question = REFERENCE_CHATS[0]["messages"][0]["content"]
    greedy = {"model": MODEL, "temperature": 0, "max_output_tokens": 16}
    lines = [
        line("plain", RESPONSES, {**greedy, "input": question}),
        line(
            "items",
            RESPONSES,
            {**greedy, "input": [{"role": "user", "content": question}], "store": True},
        ),
        line(
            "instructions",
            RESPONSES,
            {**greedy, "instructions": "Answer in French.", "input": question},
        ),
        line("background", RESPONSES, {**greedy, "input": question, "background": True}),
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines), endpoint=RESPONSES)
        batch = wait_status(client, batch_id, "completed", timeout=120)
        by_id = results(client, batch)
    assert batch.request_counts is not None
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 1)
    answers = {}
    for custom_id in ("plain", "items", "instructions"):
        body = by_id[custom_id]["response"]["body"]
        parsed = openai.types.responses.Response.model_validate(body)
        assert parsed.object == "response" and parsed.usage is not None
        if parsed.status != "completed":  # cut at max_output_tokens, as OpenAI reports it
            assert parsed.status == "incomplete" and parsed.incomplete_details is not None
            assert parsed.incomplete_details.reason == "max_output_tokens"
            assert parsed.usage.output_tokens == 16
        assert parsed.id.startswith("resp_") and parsed.model == MODEL
        answers[custom_id] = parsed.output_text
    # The same messages through /v1/responses and vLLM's own LLM.chat: the same greedy answer.
    assert answers["plain"] == answers["items"] == reference()[0]
    assert answers["instructions"] != answers["plain"]
    refused = by_id["background"]["response"]
    assert refused["status_code"] == 400 and refused["body"]["error"]["param"] == "background"
    usages = [by_id[c]["response"]["body"]["usage"] for c in answers]
    assert batch.usage is not None
    assert batch.usage.input_tokens == sum(u["input_tokens"] for u in usages)
    assert batch.usage.output_tokens == sum(u["output_tokens"] for u in usages) > 0


def test_chat_tool_calls(local: Deployment) -> None:
    weather = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city today.",
            "strict": True,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    forced = {"type": "function", "function": {"name": "get_weather"}}
    lines = [
        chat_line(
            f"tool-{choice}",
            "What is the weather in Paris today?",
            max_tokens=60,
            temperature=0,
            tools=[weather],
            tool_choice=forced if choice == "named" else choice,
        )
        for choice in ("named", "required", "none", "auto")
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines))
        batch = wait_status(client, batch_id, "completed", timeout=120)
        by_id = results(client, batch)
    for choice in ("named", "required"):
        body = by_id[f"tool-{choice}"]["response"]["body"]
        assert by_id[f"tool-{choice}"]["response"]["status_code"] == 200, body
        message = openai.types.chat.ChatCompletion.model_validate(body).choices[0].message
        assert message.tool_calls, body
        call = message.tool_calls[0]
        assert call.type == "function" and call.function.name == "get_weather"
        # `strict` holds the arguments to the schema: an object, not any JSON value.
        assert json.loads(call.function.arguments) == {"city": "Paris"}
    plain = by_id["tool-none"]["response"]["body"]["choices"][0]["message"]
    assert not plain.get("tool_calls") and plain["content"]
    # With "auto" the model decides; either way the body is a valid chat completion.
    auto = by_id["tool-auto"]["response"]
    assert auto["status_code"] == 200
    openai.types.chat.ChatCompletion.model_validate(auto["body"])
    assert batch.request_counts is not None and batch.request_counts.completed == 4


def test_embeddings_batch(local: Deployment) -> None:
    local.workers["minilm"].wait_ready()
    texts = [
        "A cat sits on the mat.",
        "A kitten rests on a rug.",
        "Stock markets fell sharply today.",
    ]
    bodies = [{"model": MINILM, "input": t} for t in texts]
    lines = [line(f"e-{i}", EMBEDDINGS, body) for i, body in enumerate(bodies)]
    listed_body = {"model": MINILM, "input": texts[:2], "encoding_format": "base64"}
    lines.append(line("e-list", EMBEDDINGS, listed_body))
    too_long = {"model": MINILM, "input": "word " * 400}  # MiniLM takes 256 tokens
    lines.append(line("e-long", EMBEDDINGS, too_long))
    lines.append(line("e-0-again", EMBEDDINGS, bodies[0]))  # answered once, copied
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines), endpoint=EMBEDDINGS)
        batch = wait_status(client, batch_id, "completed", timeout=120)
        by_id = results(client, batch)
    vectors = [by_id[f"e-{i}"]["response"]["body"]["data"][0]["embedding"] for i in range(3)]
    assert all(len(v) == 384 for v in vectors)

    def cosine(a: list[float], b: list[float]) -> float:
        dot = sum(x * y for x, y in zip(a, b, strict=True))
        return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)

    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2]) + 0.2
    first, again = by_id["e-0"]["response"]["body"], by_id["e-0-again"]["response"]["body"]
    assert again["data"] == first["data"] and again["usage"] == first["usage"]
    assert again["id"] != first["id"] and again["id"].startswith("embd-")
    listed = by_id["e-list"]["response"]["body"]
    assert listed["object"] == "list" and len(listed["data"]) == 2
    assert batch.usage is not None and batch.usage.input_tokens > 0
    # The worker's online API is vLLM's own app (`vllm serve`'s routes) on the same engine:
    # each batch line's status and body are what it answers to the same body, bar the
    # request's own id and time, and the vectors' last bits: in bfloat16 (the rule's pick
    # here) vLLM's kernels round differently by the batch a sequence runs in, as `vllm serve`
    # does for concurrent requests (a batch line ran beside the others, the online request
    # alone; they differed in the third digit).
    port = local.workers["minilm"].online_port()
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as online:
        for custom_id, body in [("e-0", bodies[0]), ("e-list", listed_body)]:
            answered = online.post("/v1/embeddings", json=body)
            ours = by_id[custom_id]["response"]
            assert ours["status_code"] == answered.status_code == 200
            theirs = answered.json()
            assert without_vectors(ours["body"]) == without_vectors(theirs)
            assert min(cosines(vectors_of(ours["body"]), vectors_of(theirs))) >= SAME_DIRECTION
        refused = online.post("/v1/embeddings", json=too_long)
    long_line = by_id["e-long"]
    assert long_line["response"]["status_code"] == refused.status_code == 400
    message = refused.json()["error"]["message"]
    assert "maximum context length" in message
    assert long_line["response"]["body"]["error"]["message"] == message


def without_vectors(body: dict[str, Any]) -> dict[str, Any]:
    """An embeddings answer without its id, its time and its vectors' values."""
    kept = {key: value for key, value in body.items() if key not in ("id", "created")}
    data = [{k: v for k, v in item.items() if k != "embedding"} for item in body["data"]]
    return kept | {"data": data}


def vectors_of(body: dict[str, Any]) -> list[list[float]]:
    """An embeddings answer's vectors, float lists or base64 float32s alike."""
    return [
        np.frombuffer(base64.b64decode(v), dtype="<f4").tolist() if isinstance(v, str) else v
        for v in (item["embedding"] for item in body["data"])
    ]


def test_score_and_rerank_batches(local: Deployment) -> None:
    """vLLM's scoring endpoints, at their /v1 and bare paths, on the bundled MiniLM."""
    local.workers["minilm"].wait_ready()
    question = "What is the capital of France?"
    documents = ["The capital of Brazil is Brasilia.", "The capital of France is Paris."]
    score = {"model": MINILM, "queries": question, "documents": documents}
    rerank = {"model": MINILM, "query": question, "documents": documents}
    with local.client() as client:
        scored = start_batch(
            client,
            jsonl([line("s-v1", "/v1/score", score), line("s-bare", "/score", score)]),
            endpoint="/v1/score",
        )
        ranked = start_batch(
            client,
            jsonl([line("r-bare", "/rerank", rerank), line("r-v1", "/v1/rerank", rerank)]),
            endpoint="/rerank",
        )
        scores = results(client, wait_status(client, scored, "completed", timeout=120))
        ranks = results(client, wait_status(client, ranked, "completed", timeout=120))
    for item in scores.values():
        body = item["response"]["body"]
        assert item["response"]["status_code"] == 200 and body["object"] == "list"
        brazil, france = (d["score"] for d in body["data"])
        assert france > brazil
    for item in ranks.values():
        body = item["response"]["body"]
        assert item["response"]["status_code"] == 200
        assert body["results"][0]["index"] == 1 and body["usage"]["prompt_tokens"] > 0


def long_lines(prefix: str, quick: int, slow: int, slow_tokens: int = 400) -> list[bytes]:
    lines = [chat_line(f"{prefix}q{i}", max_tokens=4, temperature=0) for i in range(quick)]
    lines += [
        chat_line(
            f"{prefix}s{i}",
            f"Tell story number {i}.",
            max_tokens=slow_tokens,
            temperature=0,
            ignore_eos=True,
        )
        for i in range(slow)
    ]
    return lines


def test_cancel_aborts_in_flight_within_two_seconds(local: Deployment) -> None:
    with local.client() as client:
        batch_id = start_batch(client, jsonl(long_lines("", 4, 24)))
        wait_completed(client, batch_id, 4)
        started = time.monotonic()
        client.batches.cancel(batch_id)
        batch = wait_status(client, batch_id, "cancelled", timeout=30)
        elapsed = time.monotonic() - started
        by_id = results(client, batch)
    assert elapsed < 3.0, f"cancelled after {elapsed:.1f}s"
    assert len(by_id) == 28
    cancelled = [v for v in by_id.values() if v["error"] is not None]
    assert cancelled and {v["error"]["code"] for v in cancelled} == {"batch_cancelled"}
    assert all(by_id[f"q{i}"]["error"] is None for i in range(4))
    assert "cancelled, aborted" in local.workers["chat-1"].tail(20000)


def test_expiry_mid_run(local: Deployment) -> None:
    with local.client() as client:
        batch_id = start_batch(client, jsonl(long_lines("x", 3, 12)))
        wait_completed(client, batch_id, 3)
        with session_scope(local.settings) as session:
            session.execute(
                update(Batch).where(Batch.id == batch_id).values(expires_at=int(time.time()))
            )
        batch = wait_status(client, batch_id, "expired", timeout=30)
        by_id = results(client, batch)
    assert batch.expired_at is not None
    assert all(by_id[f"xq{i}"]["error"] is None for i in range(3))
    expired = [v for v in by_id.values() if v["error"] is not None]
    assert expired and {v["error"]["code"] for v in expired} == {"batch_expired"}
    assert "expired, aborted" in local.workers["chat-1"].tail(20000)


def test_two_workers_share_a_batch_on_postgresql(
    smollm2: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # A lapsed lease would hand a shard's unrecorded lines to the other worker, sent by both.
    postgresql = tmp_path_factory.mktemp("postgresql")
    with deployment("postgresql", postgresql, lease_seconds=PRODUCT_LEASE_SECONDS) as shared:
        workers = [shared.start_worker(f"pg-{i}", smollm2_args(smollm2)) for i in range(2)]
        for worker in workers:
            worker.wait_ready()
        lines = [
            chat_line(f"p{i}", f"Say something about {i}.", max_tokens=16, temperature=0)
            for i in range(96)
        ]
        with shared.client() as client:
            batch_id = start_batch(client, jsonl(lines))
            batch = wait_status(client, batch_id, "completed", timeout=300)
            by_id = results(client, batch)
        assert len(by_id) == 96 and batch.request_counts is not None
        assert batch.request_counts.completed == 96
        ran = [set(w.submissions(batch_id)) for w in workers]
        assert ran[0] and ran[1], "one worker took every shard"
        assert not ran[0] & ran[1] and ran[0] | ran[1] == set(range(1, 97))


def test_two_projects_progress_together_and_the_later_small_batch_ends_first(
    local: Deployment,
) -> None:
    """Fair share on the real engine: B's 16 requests, created while A's 320 run, end first."""
    a_total = 320  # 20 shards of 16: B's one shard starts within one shard's time
    lines = [
        chat_line(f"a{i}", f"Say a word about {i}.", max_tokens=8, ignore_eos=True)
        for i in range(a_total)
    ]
    with local.client() as client:
        big = start_batch(client, jsonl(lines))
        wait_completed(client, big, 32, timeout=300)
        with session_scope(local.settings) as session:
            beta = ensure_project(session, "beta").id
        data = jsonl([chat_line(f"b{i}", f"Name a colour, {i}.", max_tokens=8) for i in range(16)])
        file_id = store_input_file(local.settings, data, beta)
        request = CreateBatchRequest(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
        with session_scope(local.settings) as session:
            small = create_batch(session, local.settings, beta, request).id
        a_at_b_start = client.batches.retrieve(big).request_counts
        deadline = time.monotonic() + 300
        while (b := load_batch(local.settings, small)).status != "completed":
            assert time.monotonic() < deadline, b.status
            time.sleep(0.2)
        a_at_b_end = client.batches.retrieve(big)
        assert a_at_b_end.status == "in_progress", "A ended before B: B waited behind it"
        assert a_at_b_start is not None and a_at_b_end.request_counts is not None
        # Both progressed while B ran: A kept going beside it.
        assert a_at_b_end.request_counts.completed > a_at_b_start.completed
        assert a_at_b_end.request_counts.completed < a_total
        assert b.completed == 16
        try:
            wait_status(client, big, "completed", timeout=240)
        except AssertionError as stuck:
            raise AssertionError(f"{stuck}\n{local.workers['chat-1'].tail(20000)}") from None


# --- the dtype each worker picked (worker/dtype.py; its rule per CPU kind: tests/test_dtype.py)
# answers correctly here, and the worker shows it. `local`'s workers leave the dtype to the rule.

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Japan": "Tokyo", "Egypt": "Cairo", "Russia": "Moscow", "China": "Beijing",
    "Greece": "Athens", "Portugal": "Lisbon", "Austria": "Vienna", "United Kingdom": "London",
}  # fmt: skip
# Below float32's own count by a margin for greedy flips: where a dtype's kernels lose too much
# the model names almost none (bfloat16 on an AMX Xeon answered France with "L'Étoile").
ENOUGH_CAPITALS = 9
# bfloat16 keeps 8 bits of mantissa: MiniLM's bfloat16 vectors had a cosine of 0.99993 or more
# with float32's here (float16's 0.999999), ten times inside this bound. A kernel that computes
# wrongly (overflow, a wrong accumulation type) turns the vector well away from it, and two
# unrelated sentences of SENTENCES are far below it.
SAME_DIRECTION = 0.999


@pytest.fixture(scope="module")
def float32_vectors(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[], Any]]:
    """Raw vLLM's float32 embeddings of SENTENCES, computed while the workers start."""
    target = tmp_path_factory.mktemp("reference") / "float32.json"
    command = [sys.executable, "-m", "tests.reference_embeddings", FLOAT32, str(target)]
    log = target.with_suffix(".log").open("wb")
    child = subprocess.Popen(
        command, env=child_env(ENGINE_ENV), cwd=REPO, stdout=log, stderr=subprocess.STDOUT
    )

    def vectors() -> Any:
        failed = child.wait(timeout=900) != 0
        assert not failed, target.with_suffix(".log").read_text(errors="replace")[:6000]
        return json.loads(target.read_text())

    yield vectors
    child.kill()
    log.close()


def cosines(a: list[list[float]], b: list[list[float]]) -> list[float]:
    x, y = np.array(a), np.array(b)
    return list((x * y).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(y, axis=1))


@pytest.mark.engine
def test_embeddings_in_the_picked_dtype_point_as_float32s(
    local: Deployment, float32_vectors: Callable[[], Any]
) -> None:
    local.workers["minilm"].wait_ready(timeout=900)
    lines = [
        line(f"e{i}", EMBEDDINGS, {"model": MINILM, "input": s}) for i, s in enumerate(SENTENCES)
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines), endpoint=EMBEDDINGS)
        by_id = results(client, wait_status(client, batch_id, "completed", timeout=300))
    ours = [
        by_id[f"e{i}"]["response"]["body"]["data"][0]["embedding"] for i in range(len(SENTENCES))
    ]
    reference = float32_vectors()
    assert min(cosines(ours, reference)) >= SAME_DIRECTION
    # Different sentences stay apart: the check above could not pass on a constant vector.
    assert max(cosines(ours[:-1], reference[1:])) < SAME_DIRECTION


@pytest.mark.engine
def test_the_chat_model_in_its_picked_dtype_names_the_capitals(local: Deployment) -> None:
    local.workers["chat-1"].wait_ready(timeout=900)
    lines = [
        chat_line(country, f"What is the capital of {country}?", max_tokens=24, temperature=0)
        for country in CAPITALS
    ]
    with local.client() as client:
        batch_id = start_batch(client, jsonl(lines))
        by_id = results(client, wait_status(client, batch_id, "completed", timeout=300))
    answers = {
        c: by_id[c]["response"]["body"]["choices"][0]["message"]["content"] for c in CAPITALS
    }
    named = [c for c, city in CAPITALS.items() if city in answers[c]]
    assert "France" in named and len(named) >= ENOUGH_CAPITALS, answers


@pytest.mark.engine
def test_the_worker_shows_its_dtype_and_why(local: Deployment) -> None:
    worker = local.workers["minilm"]
    worker.wait_ready(timeout=900)
    here = worker_dtype(None)
    assert f"dtype {here}" in worker.log_path.read_text(errors="replace")
    with httpx.Client(base_url=local.server.url, timeout=60) as http:
        page = http.get("/dashboard/workers/minilm").text
        feed = http.get("/dashboard/api/workers/minilm").json()
    effective = {pair["key"]: pair["value"] for pair in feed["effective"]}
    assert (effective["dtype"], effective["dtype_reason"]) == (here.dtype, here.reason)
    assert here.reason.replace("'", "&#39;") in page
