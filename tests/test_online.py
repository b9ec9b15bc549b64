"""The worker's online API on the real engine, beside a running batch.

One SQLite deployment and one SmolLM2 worker with `--online-port` serve every test (the
engine start is the cost); vLLM's `LLM.chat` answers are computed in a subprocess while it
starts. The worker runs with a small scheduler (8 sequences, so a window of 16) to make a
full window cheap. Its online API is vLLM's own `/v1/messages` too, which Anthropic's Message
Batches answer as. The last test SIGKILLs the worker and finishes its batch on a new one.
"""

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import psutil
import pytest
from anthropic.types.messages import MessageBatchSucceededResult
from prometheus_client.parser import text_string_to_metric_families

from app.db.session import session_scope
from app.endpoints import MESSAGES
from app.services import online_usage
from app.services.auth import create_key
from tests.engine_fixtures import (
    MODEL,
    Deployment,
    WorkerProcess,
    chat_line,
    deployment,
    file_lines,
    jsonl,
    line,
    persisted,
    results,
    smollm2_args,
    start_batch,
    wait_completed,
    wait_status,
)
from tests.file_server import Files
from tests.harness import free_port
from tests.reference_llm import REFERENCE_CHATS
from tests.test_message_batches import params, sdk, wait_ended
from worker.online import USAGE_FLUSH_SECONDS

pytestmark = pytest.mark.engine

MAX_NUM_SEQS = 8  # the window is twice this; the busy window 4 (the CPU default)
# The shared reference chats this file asks (their answers: `Online.reference`).
ASKED = (0, 1, 4)
CHATS = [REFERENCE_CHATS[i] for i in ASKED]


@dataclass
class Online:
    deployment: Deployment
    worker: WorkerProcess
    url: str
    keys: dict[str, str]  # project -> secret; "default" is an admin key
    reference: Callable[[], list[str]]

    def batches(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.deployment.server.base_url, api_key=self.keys["default"], max_retries=0
        )

    def client(self, project: str = "default") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.keys[project], max_retries=0)

    def post(self, path: str, body: dict[str, Any], project: str = "default") -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.keys[project]}"}
        return httpx.post(f"{self.url}{path}", json=body, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def online(
    smollm2: Path, reference: Callable[[], list[str]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Online]:
    def answers() -> list[str]:
        return [reference()[i] for i in ASKED]

    # /metrics names projects only when asked to.
    with deployment("sqlite", tmp_path_factory.mktemp("online"), metrics_per_batch=True) as running:
        with session_scope(running.settings) as session:
            keys = {"default": create_key(session, "default", role="admin")[1]}
            keys |= {p: create_key(session, p)[1] for p in ("alpha", "beta")}
        port = free_port()
        flags = ["--max-num-seqs", str(MAX_NUM_SEQS), "--online-port", str(port)]
        # These tests ask online at test pace, minutes apart on a loaded machine; by the mean
        # gap rule the batch window would then stay small for 30 s after each online answer,
        # longer than the next test's batch takes (the rule: tests/test_worker_scheduler.py).
        flags += ["--online-quiet-gaps", "0"]
        worker = running.start_worker("online-1", [*smollm2_args(smollm2), *flags])
        worker.wait_ready(timeout=900)
        yield Online(running, worker, f"http://127.0.0.1:{port}", keys, answers)


def batch_lines(prefix: str, n: int, max_tokens: int) -> bytes:
    return jsonl(
        [
            chat_line(f"{prefix}{i}", f"Tell a story about the number {i}.", max_tokens=max_tokens)
            for i in range(n)
        ]
    )


def chat_body(chat: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "temperature": 0, **chat, **extra}


def test_online_answers_as_vllm_while_a_batch_runs(online: Online) -> None:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionResponse

    with online.batches() as client:
        batch_id = start_batch(client, batch_lines("bg", 48, 32))
        wait_completed(client, batch_id, 1)
        bodies = [online.post("/v1/chat/completions", chat_body(c)).json() for c in CHATS]
        assert client.batches.retrieve(batch_id).status == "in_progress"
        same = chat_line("same", **chat_body(CHATS[0]))
        twin_id = start_batch(client, jsonl([same]))
        twin = results(client, wait_status(client, twin_id, "completed", timeout=240))
        wait_status(client, batch_id, "completed", timeout=240)
    # The worker's own INFO lines survive vLLM's app (an import of it sets the root to ERROR).
    assert "worker online-1 serving" in online.worker.tail(1_000_000)
    for body, text in zip(bodies, online.reference(), strict=True):
        assert body["object"] == "chat.completion" and body["model"] == MODEL
        assert body["choices"][0]["message"]["content"] == text
        # vLLM's own response model, serialized by vLLM's route: every field, nothing else.
        assert set(body) == set(ChatCompletionResponse.model_fields)
        assert body["usage"]["completion_tokens"] > 0
    # The same request as a batch line: the same body from the same serving object.
    batch_body = twin["same"]["response"]["body"]
    varying = ("id", "created")
    assert {k: v for k, v in batch_body.items() if k not in varying} == {
        k: v for k, v in bodies[0].items() if k not in varying
    }
    models = httpx.get(
        f"{online.url}/v1/models", headers={"Authorization": f"Bearer {online.keys['alpha']}"}
    ).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    prompt = {"model": MODEL, "prompt": "1, 2, 3,", "max_tokens": 4}
    completion = online.post("/v1/completions", prompt)
    assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
    response = online.post("/v1/responses", {"model": MODEL, "input": "Hi", "max_output_tokens": 8})
    assert response.status_code == 200 and response.json()["object"] == "response"


def test_a_streamed_answer(online: Online) -> None:
    with online.client("alpha") as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=CHATS[0]["messages"],
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == online.reference()[0]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens > 1


def test_online_requests_go_before_batch_requests_sent_earlier(online: Online) -> None:
    window = 2 * MAX_NUM_SEQS
    # Long batch answers (seconds each): in arrival order the online one would wait for them.
    long_tokens = 128
    long = [
        chat_line(f"p{i}", f"Tell a story about {i}.", max_tokens=long_tokens, ignore_eos=True)
        for i in range(window)
    ]
    worker = online.worker

    def in_engine() -> set[int]:
        return set(worker.submissions(batch_id)) - set(worker.finished(batch_id))

    with online.batches() as client:
        batch_id = start_batch(client, jsonl(long))
        wait_until(lambda: len(in_engine()) >= window, 120, "a full window")
        time.sleep(0.5)  # every engine slot taken, the rest queued in the engine
        done_before = set(worker.finished(batch_id))
        waiting = set(worker.submissions(batch_id)) - done_before
        asked = time.monotonic()
        body = online.post("/v1/chat/completions", chat_body(CHATS[2], max_tokens=8)).json()
        took = time.monotonic() - asked
        # The worker's engine wrapper notes each batch answer as it comes back.
        ended_meanwhile = set(worker.finished(batch_id)) - done_before
        assert body["usage"]["completion_tokens"] > 0
        batch = wait_status(client, batch_id, "completed", timeout=300)
        by_id = results(client, batch)
    # In arrival order the online request gets an engine slot after every batch request
    # queued in the engine before it has one: more than `waiting - MAX_NUM_SEQS` would end.
    assert len(ended_meanwhile) <= len(waiting) - MAX_NUM_SEQS, (
        f"{len(ended_meanwhile)} of {len(waiting)} ended while it ran ({took:.2f} s)"
    )
    # Preempted or not, every line has its own full answer, once.
    assert len(by_id) == window
    assert all(v["error"] is None and v["response"]["status_code"] == 200 for v in by_id.values())
    made = [v["response"]["body"]["usage"]["completion_tokens"] for v in by_id.values()]
    assert made == [long_tokens] * len(by_id)
    resent = online.worker.submissions(batch_id)
    assert len(resent) > len(set(resent)), "no batch request was preempted"


def test_each_key_counts_for_its_own_project(online: Online) -> None:
    settings = online.deployment.settings

    def usage() -> dict[str, online_usage.UsageRow]:
        with session_scope(settings) as session:
            return {row.project: row for row in online_usage.totals(session)}

    before = settled(usage)
    denied = httpx.post(f"{online.url}/v1/chat/completions", json=chat_body(CHATS[0]))
    assert denied.status_code == 401 and "error" in denied.json()
    admin = online.post("/v1/chat/completions", chat_body(CHATS[0]), project="default")
    assert admin.status_code == 200  # a control: the admin key works
    headers = {"Authorization": "Bearer sk-ovn-not-a-key"}
    url = f"{online.url}/v1/chat/completions"
    forged = httpx.post(url, json=chat_body(CHATS[0]), headers=headers)
    assert forged.status_code == 401 and forged.json()["error"]["code"] == "invalid_api_key"
    answer = online.post("/v1/chat/completions", chat_body(CHATS[1]), project="beta").json()
    wait_until(lambda: usage().get("beta") != before.get("beta"), 10, "beta's usage to be recorded")
    after = usage()
    beta, was = after["beta"], before.get("beta")
    assert beta.requests - (was.requests if was else 0) == 1
    assert beta.input_tokens - (was.input_tokens if was else 0) == answer["usage"]["prompt_tokens"]
    made = answer["usage"]["completion_tokens"]
    assert beta.output_tokens - (was.output_tokens if was else 0) == made
    assert after.get("alpha") == before.get("alpha"), "alpha was charged for beta's request"
    metrics = httpx.get(f"{online.deployment.server.url}/metrics").text
    [family] = [
        f for f in text_string_to_metric_families(metrics) if f.name == "overnight_online_requests"
    ]
    counted = {
        (s.labels["project"], s.labels["model"]): s.value
        for s in family.samples
        if s.name == "overnight_online_requests_total"
    }
    assert counted[("beta", MODEL)] == beta.requests


def settled(read: Callable[[], Any]) -> Any:
    """What `read` gives once a whole flush interval went by without a change: earlier tests'
    online requests are counted up to a flush after their answer."""
    last = read()
    while True:
        time.sleep(2 * USAGE_FLUSH_SECONDS)
        if (now := read()) == last:
            return now
        last = now


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_members_reach_inference_routes_only_and_no_private_media(
    online: Online, file_server: str
) -> None:
    member = {"Authorization": f"Bearer {online.keys['alpha']}"}
    admin = {"Authorization": f"Bearer {online.keys['default']}"}
    # vLLM's engine operations and routes on other callers' objects exist for no key.
    operations = ["/scale_elastic_ep", "/is_scaling_elastic_ep", "/inference/v1/abort_requests"]
    for path in [*operations, "/v1/chat/completions/render", "/invocations"]:
        for headers in (member, admin):
            answer = httpx.post(f"{online.url}{path}", json={}, headers=headers, timeout=30)
            assert answer.status_code == 404, (path, answer.text)
            assert answer.json()["error"]["message"] == f"Invalid URL (POST {path})"
    for path in ("/v1/responses/resp_0", "/metrics", "/version", "/load", "/docs"):
        assert httpx.get(f"{online.url}{path}", headers=member).status_code == 404, path
    tokens = httpx.post(
        f"{online.url}/tokenize", json={"model": MODEL, "prompt": "1, 2"}, headers=member
    )
    assert tokens.status_code == 200 and tokens.json()["tokens"]
    # A media URL the deployment does not allow (it allows none) is refused, never fetched.
    Files.served["/online.png"] = b"not an image"
    parts = [
        {"type": "text", "text": "What is in it?"},
        {"type": "image_url", "image_url": {"url": f"{file_server}/online.png"}},
    ]
    looking = chat_body({"messages": [{"role": "user", "content": parts}]}, max_tokens=4)
    refused = online.post("/v1/chat/completions", looking, project="alpha")
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == (
        "media_url_not_allowed",
        "messages[0].content[1].image_url",
    )
    assert "/online.png" not in Files.requested


def test_message_batch_results_equal_vllms_own_messages(online: Online) -> None:
    """Anthropic's Message Batches and `/v1/messages` lines of an OpenAI batch answer as the
    worker's online API, which is vLLM's own `/v1/messages`, answers the same requests."""
    texts = ["Name three colors.", "What is the capital of France?"]
    asked: list[Any] = [params(t, max_tokens=24, temperature=0) for t in texts]
    key = online.keys["default"]
    server = online.deployment.server
    with sdk(server, key) as client:
        created = client.messages.batches.create(
            requests=[{"custom_id": f"m-{i}", "params": p} for i, p in enumerate(asked)]
        )
        ended = wait_ended(client, created.id, timeout=600)
        assert ended.request_counts.succeeded == 2
        typed = {r.custom_id: r.result for r in client.messages.batches.results(created.id)}
        assert all(isinstance(r, MessageBatchSucceededResult) for r in typed.values())
    sent = httpx.get(str(ended.results_url), headers={"x-api-key": key})
    answered = {r["custom_id"]: r["result"] for r in map(orjson.loads, sent.content.splitlines())}
    with online.batches() as oai:
        lines = [line(f"o-{i}", MESSAGES, p) for i, p in enumerate(asked)]
        batch_id = start_batch(oai, jsonl(lines), endpoint=MESSAGES)
        done = wait_status(oai, batch_id, "completed", "failed", timeout=600)
        assert done.status == "completed", done.errors
        outputs = {o["custom_id"]: o["response"] for o in file_lines(oai, done.output_file_id)}
    for i, p in enumerate(asked):
        own = online.post("/v1/messages", p)
        assert own.status_code == 200, own.text
        reference = without_id(own.json())
        result = answered[f"m-{i}"]
        assert result["type"] == "succeeded"
        assert without_id(result["message"]) == reference
        assert outputs[f"o-{i}"]["status_code"] == 200
        assert without_id(outputs[f"o-{i}"]["body"]) == reference
        assert reference["content"][0]["text"]  # the model said something


def without_id(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "id"}


def test_sigkill_with_online_and_batch_traffic_loses_nothing(online: Online, smollm2: Path) -> None:
    old = online.worker
    n = 40
    stop = threading.Event()
    answered: list[int] = []

    def online_traffic() -> None:
        with online.client("alpha") as client:
            while not stop.is_set():
                try:
                    stream = client.chat.completions.create(
                        model=MODEL, messages=CHATS[0]["messages"], max_tokens=16, stream=True
                    )
                    answered.append(sum(1 for _ in stream))
                except Exception:
                    return  # the worker is gone (mid-stream or at connect)

    with online.batches() as client:
        batch_id = start_batch(client, batch_lines("k", n, 24))
        sender = threading.Thread(target=online_traffic)
        sender.start()
        wait_completed(client, batch_id, 8)
        assert answered, "no online answer while the batch ran"
        engine = old.descendants()
        assert engine, "the worker has no engine processes"
        os.kill(old.process.pid, signal.SIGKILL)
        old.process.wait(10)
        stop.set()
        sender.join(30)
        _, alive = psutil.wait_procs(engine, timeout=60)
        assert not alive, f"orphaned engine processes: {[p.pid for p in alive]}"
        before = persisted(online.deployment.settings, batch_id)
        assert 8 <= len(before) < n
        new = online.deployment.start_worker("online-2", smollm2_args(smollm2))
        batch = wait_status(client, batch_id, "completed", timeout=900)
        by_id = results(client, batch)
    assert set(by_id) == {f"k{i}" for i in range(n)}
    assert all(v["error"] is None for v in by_id.values())
    assert batch.request_counts is not None and batch.request_counts.completed == n
    rerun = set(new.submissions(batch_id)) & set(before)
    assert not rerun, f"lines run again after their results were persisted: {sorted(rerun)}"
    assert set(old.submissions(batch_id)) | set(new.submissions(batch_id)) >= set(range(1, n + 1))
    for output in before.values():
        assert by_id[output["custom_id"]] == output
