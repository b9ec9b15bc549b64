"""Receivers that answer a byte at a time, or without end, cost their own endpoint's
slots and nothing else: a test event ends by the deadline, other endpoints get their events,
batches are validated and finalized at their pace. Real receivers on loopback sockets, the
real app under uvicorn."""

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import orjson
import pytest

from app.config import Settings
from tests import batch_sim as sim
from tests.harness import RunningServer, running_server
from tests.test_webhooks import create_batch, sdk, wait_status
from tests.webhook_receiver import DRIP, FLOOD, running_receiver, stalling_receiver

DEADLINE = 2.0
# Generous beside the deadline, short beside the 60 s a stalling receiver keeps it up.
BOUND = 15.0
# Concurrent test events: more than the default executor's threads on any machine (32 at
# most), which is where every attempt ran before.
TESTS = 40


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Loopback receivers allowed, and a deadline well above the drip's 0.5 s gaps (which
    are what a per-read timeout lets through)."""
    return settings.model_copy(
        update={
            "webhook_allow_private": True,
            "webhook_timeout_seconds": DEADLINE,
            "webhook_retry_seconds": 0.2,
            "housekeeping_interval_seconds": 0.2,
            "lease_seconds": 2.0,
        }
    )


def patient(settings: Settings) -> Settings:
    """A deadline longer than `BOUND`: what is timed then cannot be the deadline's doing."""
    return settings.model_copy(update={"webhook_timeout_seconds": 30.0})


# A test event's HTTP status (0: no answer within `BOUND`) and the seconds it took.
Answer = tuple[int, float]


def send_test(http: httpx.Client, server: RunningServer, endpoint_id: str) -> Answer:
    url = f"{server.base_url}/webhook_endpoints/{endpoint_id}/test"
    start = time.monotonic()
    try:
        status = http.post(url, json={"event_type": "batch.completed"}).status_code
    except httpx.TimeoutException:
        status = 0
    return status, time.monotonic() - start


def send_tests_at_once(server: RunningServer, endpoint_id: str) -> list[Answer]:
    """`TESTS` test events of the endpoint's, sent at the same time."""
    limits = httpx.Limits(max_connections=TESTS)
    with httpx.Client(timeout=BOUND, limits=limits) as http, ThreadPoolExecutor(TESTS) as pool:
        sent = [pool.submit(send_test, http, server, endpoint_id) for _ in range(TESTS)]
        return [answer.result() for answer in sent]


@contextmanager
def hammering(server: RunningServer, endpoint_id: str) -> Iterator[list[Answer]]:
    """`TESTS` threads sending the endpoint's test events one after another, until the end."""
    answers: list[Answer] = []
    stop = threading.Event()

    def send_tests() -> None:
        with httpx.Client(timeout=BOUND) as http:
            while not stop.is_set():
                answers.append(send_test(http, server, endpoint_id))

    with ThreadPoolExecutor(TESTS) as pool:
        running = [pool.submit(send_tests) for _ in range(TESTS)]
        try:
            yield answers
        finally:
            stop.set()
            for thread in running:
                thread.result()


def deliveries(client: openai.OpenAI, endpoint_id: str) -> list[dict[str, Any]]:
    url = f"/webhook_endpoints/{endpoint_id}/deliveries?limit=100"
    rows: list[dict[str, Any]] = client.get(url, cast_to=httpx.Response).json()["data"]
    return rows


def test_test_events_to_a_dripping_receiver_end_by_the_deadline(
    settings: Settings, server: RunningServer, client: openai.OpenAI
) -> None:
    with stalling_receiver(DRIP) as slow:
        endpoint = client.webhooks.create(name="slow", url=slow.url, event_types=["batch.failed"])
        answers = send_tests_at_once(server, endpoint.id)
        assert max(elapsed for _status, elapsed in answers) < BOUND
        assert {status for status, _elapsed in answers} == {400}  # webhook_unreachable
        # The bound per endpoint, all of it used: a timed-out attempt's connection is closed
        # before its slot's next attempt connects.
        assert slow.most_open == settings.webhook_sends_per_endpoint
    rows = deliveries(client, endpoint.id)
    assert len(rows) == TESTS
    assert {r["status"] for r in rows} == {"failed"}
    assert all("TimeoutError" in r["last_error"] for r in rows)


def test_a_hanging_receiver_delays_no_other_endpoints_events(settings: Settings) -> None:
    with (
        running_server(patient(settings)) as server,
        stalling_receiver(DRIP) as slow,
        running_receiver() as healthy,
    ):
        client = sdk(server.base_url)
        hanging = client.webhooks.create(name="s", url=slow.url, event_types=["batch.failed"])
        client.webhooks.create(name="ok", url=healthy.url, event_types=["batch.failed"])
        early = {create_batch(settings, b"not json\n") for _ in range(4)}
        slow.wait_for(2)  # its attempts hang from now on, for up to 30 s
        healthy.wait_for(4)
        late = create_batch(settings, b"not json\n")
        got = [orjson.loads(d.body)["data"]["id"] for d in healthy.wait_for(5, timeout=BOUND)]
        assert (set(got[:4]), got[4]) == (early, late)
        # The slow endpoint's bound: two attempts, both still under way; the rest of its
        # deliveries wait, unclaimed.
        assert (slow.requests, slow.open, slow.most_open) == (2, 2, 2)
        attempts = sorted(r["attempts"] for r in deliveries(client, hanging.id))
        assert attempts == [0, 0, 0, 1, 1]


def test_batches_keep_their_pace_while_test_events_hang(
    settings: Settings, server: RunningServer, client: openai.OpenAI
) -> None:
    with stalling_receiver(DRIP) as slow:
        endpoint = client.webhooks.create(name="slow", url=slow.url, event_types=["batch.failed"])
        with hammering(server, endpoint.id) as answers:
            slow.wait_for(1)
            batch_id = _create_batch(client)
            wait_status(settings, batch_id, "in_progress", timeout=BOUND)
            sim.run_batch(settings, batch_id)
            wait_status(settings, batch_id, "completed", timeout=BOUND)
        assert answers and max(elapsed for _status, elapsed in answers) < BOUND


def _create_batch(client: openai.OpenAI) -> str:
    """Through the API, whose create route wakes validation, as a tenant's would."""
    data = client.files.create(file=("in.jsonl", sim.requests_file(3)), purpose="batch")
    batch = client.batches.create(
        input_file_id=data.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    return batch.id


def test_a_failure_with_an_endless_body_is_read_no_further_than_the_cap(
    settings: Settings,
) -> None:
    with running_server(patient(settings)) as server, stalling_receiver(FLOOD) as flood:
        client = sdk(server.base_url)
        endpoint = client.webhooks.create(name="f", url=flood.url, event_types=["batch.failed"])
        start = time.monotonic()
        result = client.webhooks.test(endpoint.id, event_type="batch.failed")
        assert time.monotonic() - start < BOUND
        assert result.status_code == 500
        (row,) = deliveries(client, endpoint.id)
        assert row["last_error"].startswith("HTTP 500: xxxx")
