"""Webhooks as OpenAI sends them: the SDK's `unwrap` verifies every delivery from a real
receiver on loopback; the outbox loses nothing to a failing, hanging or killed party."""

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.webhooks import (
    BatchCancelledWebhookEvent,
    BatchCompletedWebhookEvent,
    BatchExpiredWebhookEvent,
    BatchFailedWebhookEvent,
)

from app.cli import main
from app.config import Settings
from app.db.session import session_scope, upgrade
from app.schemas.batches import CreateBatchRequest
from app.schemas.webhooks import CreateWebhookEndpointRequest
from app.services import batches, webhook_endpoints
from app.services.auth import DEFAULT_PROJECT, Principal, create_key, ensure_project
from app.services.webhook_delivery import backoff_seconds
from app.services.webhook_targets import TargetRefused, pin
from tests import batch_sim as sim
from tests.harness import free_port, running_server
from tests.webhook_receiver import Received, Receiver, running_receiver

ALL_EVENTS = ["batch.completed", "batch.failed", "batch.expired", "batch.cancelled"]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as state:
        yield state


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """A deployment that may call loopback receivers, and retries within a test's time."""
    return settings.model_copy(
        update={
            "webhook_allow_private": True,
            "webhook_timeout_seconds": 1.0,
            "webhook_retry_seconds": 0.2,
            "housekeeping_interval_seconds": 0.2,
            "lease_seconds": 2.0,
            "completion_windows": {"24h": 86400, "2s": 2},
            "shard_lines": 5,
        }
    )


def sdk(base_url: str, api_key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(
        base_url=base_url, api_key=api_key, max_retries=0, _strict_response_validation=True
    )


def unwrap(secret: str, delivery: Received) -> Any:
    return sdk("http://unused").webhooks.unwrap(delivery.body, delivery.headers, secret=secret)


def create_batch(settings: Settings, data: bytes, window: str = "24h") -> str:
    file_id = sim.store_input_file(settings, data)
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        params = CreateBatchRequest(
            input_file_id=file_id, endpoint=sim.CHAT, completion_window=window
        )
        return batches.create_batch(session, settings, project_id, params).id


def wait_status(settings: Settings, batch_id: str, *statuses: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while (status := sim.load_batch(settings, batch_id).status) not in statuses:
        assert time.monotonic() < deadline, f"{batch_id} still {status}"
        time.sleep(0.05)
    return status


def test_each_terminal_state_sends_its_event_once_and_the_sdk_verifies_it(
    fast: Settings, receiver: Receiver
) -> None:
    # A receiver that answers at once must never be retried, so no timeout may cut a
    # first attempt short on a loaded machine (timeouts are the hanging-receiver tests').
    patient = fast.model_copy(update={"webhook_timeout_seconds": 30.0})
    with running_server(patient) as server:
        client = sdk(server.base_url)
        endpoint = client.webhooks.create(name="ci", url=receiver.url, event_types=ALL_EVENTS)
        assert endpoint.signing_secret.startswith("whsec_")

        failed = create_batch(fast, b"not json\n")
        expired = create_batch(fast, sim.requests_file(3), window="2s")
        cancelled = create_batch(fast, sim.requests_file(3))
        completed = create_batch(fast, sim.requests_file(7))
        wait_status(fast, cancelled, "in_progress")
        client.batches.cancel(cancelled)
        wait_status(fast, completed, "in_progress")
        sim.run_batch(fast, completed)
        for batch_id in (failed, expired, cancelled, completed):
            wait_status(fast, batch_id, "failed", "expired", "cancelled", "completed")

        deliveries = receiver.wait_for(4)
        time.sleep(1.0)  # time for a duplicate to arrive, were one sent
        assert len(receiver.received) == 4
        events = {
            event.data.id: event
            for event in (unwrap(endpoint.signing_secret, d) for d in deliveries)
        }
        assert isinstance(events[failed], BatchFailedWebhookEvent)
        assert isinstance(events[expired], BatchExpiredWebhookEvent)
        assert isinstance(events[cancelled], BatchCancelledWebhookEvent)
        assert isinstance(events[completed], BatchCompletedWebhookEvent)
        for batch_id, event in events.items():
            batch = client.batches.retrieve(batch_id)
            assert event.type == f"batch.{batch.status}"
            assert event.object == "event" and event.id.startswith("evt_")
            assert event.created_at == getattr(batch, f"{batch.status}_at")

        tampered = Received(
            deliveries[0].headers, deliveries[0].body.replace(b"batch_", b"batch_x"), 0
        )
        with pytest.raises(openai.InvalidWebhookSignatureError):
            unwrap(endpoint.signing_secret, tampered)
        with pytest.raises(openai.InvalidWebhookSignatureError):
            unwrap(client.webhooks.rotate_secret(endpoint.id).signing_secret, deliveries[0])

        listed = client.get(
            f"/webhook_endpoints/{endpoint.id}/deliveries", cast_to=httpx.Response
        ).json()["data"]
        assert {d["status"] for d in listed} == {"delivered"}
        assert {d["attempts"] for d in listed} == {1}
        assert all(d["latency_ms"] > 0 and d["last_status_code"] == 200 for d in listed)


def test_only_subscribed_enabled_endpoints_get_an_event(fast: Settings, receiver: Receiver) -> None:
    with running_server(fast) as server:
        client = sdk(server.base_url)
        only_completed = client.webhooks.create(
            name="c", url=receiver.url, event_types=["batch.completed"]
        )
        disabled = client.webhooks.create(name="d", url=receiver.url, event_types=ALL_EVENTS)
        client.webhooks.update(disabled.id, extra_body={"enabled": False})
        wait_status(fast, create_batch(fast, b"not json\n"), "failed")
        completed = create_batch(fast, sim.requests_file(2))
        wait_status(fast, completed, "in_progress")
        sim.run_batch(fast, completed)
        (delivery,) = receiver.wait_for(1)
        time.sleep(1.0)
        assert len(receiver.received) == 1
        event = unwrap(only_completed.signing_secret, delivery)
        assert (event.type, event.data.id) == ("batch.completed", completed)


def test_a_failing_then_hanging_receiver_gets_it_with_the_same_webhook_id(
    fast: Settings, receiver: Receiver
) -> None:
    # 500, 503, then a hang past the 1 s timeout, then accepted.
    receiver.answer = lambda n: {1: 500, 2: 503, 3: 3.0}.get(n, 200)
    with running_server(fast) as server:
        client = sdk(server.base_url)
        endpoint = client.webhooks.create(name="r", url=receiver.url, event_types=ALL_EVENTS)
        wait_status(fast, create_batch(fast, b"{}\n"), "failed")
        attempts = receiver.wait_for(4, timeout=60)
        time.sleep(0.5)
        assert len(receiver.received) == 4
        assert len({a.headers["webhook-id"] for a in attempts}) == 1
        assert len({a.body for a in attempts}) == 1
        gaps = [b.at - a.at for a, b in itertools.pairwise(attempts)]
        # Each retry waits at least its backoff, which doubles (0.2 s, 0.4 s, 0.8 s); the third
        # also waited out the 1 s timeout. The times are the receiver's: an attempt handed
        # over late on a busy machine lengthens the gap before it and shortens the one after
        # (seen: a third attempt 1 s late, then a gap of 0.88 s), so the lower bound is on the
        # whole run, from the first attempt, which follows no other.
        waits = [backoff_seconds(fast, n) for n in (1, 2, 3)]
        assert waits == [0.2, 0.4, 0.8]
        waits[2] += fast.webhook_timeout_seconds
        assert sum(gaps) >= sum(waits) * 0.95, gaps
        assert unwrap(endpoint.signing_secret, attempts[-1]).type == "batch.failed"
        deadline = time.monotonic() + 10
        while True:
            (row,) = client.get(
                f"/webhook_endpoints/{endpoint.id}/deliveries", cast_to=httpx.Response
            ).json()["data"]
            if row["status"] == "delivered" or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert (row["status"], row["attempts"], row["last_status_code"]) == ("delivered", 4, 200)
        assert row["id"] == attempts[0].headers["webhook-id"]


def test_a_delivery_survives_a_sigkilled_deliverer_and_a_restart(
    fast: Settings, receiver: Receiver
) -> None:
    # The first attempt hangs until the API process is killed; the restarted one delivers.
    receiver.answer = lambda n: 20.0 if n == 1 else 200
    upgrade(fast.sqlalchemy_url)
    with session_scope(fast) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        endpoint = webhook_endpoints.create_endpoint(
            session,
            fast,
            Principal(project_id, "member"),
            CreateWebhookEndpointRequest(name="k", url=receiver.url, event_types=ALL_EVENTS),
        )
    batch_id = create_batch(fast, b"not json\n")
    env = {
        **os.environ,
        "OVERNIGHT_DATA_DIR": str(fast.data_dir),
        "OVERNIGHT_DATABASE_URL": fast.sqlalchemy_url,
        "OVERNIGHT_WEBHOOK_ALLOW_PRIVATE": "1",
        # The attempt is killed well inside its 2 s timeout; its lease (4 x 2 + 1 s) lapses.
        "OVERNIGHT_WEBHOOK_TIMEOUT_SECONDS": "2",
        "OVERNIGHT_LEASE_SECONDS": "1",
        "OVERNIGHT_HOUSEKEEPING_INTERVAL_SECONDS": "0.2",
        "OVERNIGHT_LOG_FORMAT": "text",
    }

    def serve() -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "app.cli", "serve", "--port", str(free_port())]
        return subprocess.Popen(
            [*command, "--no-workers"],
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    first = serve()
    try:
        receiver.wait_for(1, timeout=60)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    second = serve()
    try:
        attempts = receiver.wait_for(2, timeout=60)
    finally:
        os.killpg(second.pid, signal.SIGTERM)
        second.wait(30)
    assert attempts[0].headers["webhook-id"] == attempts[1].headers["webhook-id"]
    event = unwrap(endpoint.signing_secret, attempts[1])
    assert (event.type, event.data.id) == ("batch.failed", batch_id)


def test_endpoints_are_per_project_and_urls_must_be_public(settings: Settings) -> None:
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        _key, alice = create_key(session, "alice")
        _key, bob = create_key(session, "bob")
        _key, admin = create_key(session, "ops", role="admin")
    with running_server(settings) as server:
        with pytest.raises(openai.BadRequestError, match="loopback or private") as refused:
            sdk(server.base_url, alice).webhooks.create(
                name="a", url="http://127.0.0.1:9/x", event_types=ALL_EVENTS
            )
        assert refused.value.code == "invalid_url"
        with pytest.raises(openai.BadRequestError, match="http:// or https://"):
            sdk(server.base_url, alice).webhooks.create(
                name="a", url="ftp://example.com/x", event_types=ALL_EVENTS
            )
        created = sdk(server.base_url, alice).webhooks.create(
            name="a", url="https://93.184.216.34/hook", event_types=["batch.completed"]
        )
        with pytest.raises(openai.NotFoundError):
            sdk(server.base_url, bob).webhooks.retrieve(created.id)
        assert sdk(server.base_url, bob).webhooks.list().data == []
        ops = sdk(server.base_url, admin)
        assert [e.id for e in ops.webhooks.list().data] == [created.id]
        updated = ops.webhooks.update(
            created.id, name="renamed", event_types=["batch.failed", "batch.expired"]
        )
        assert (updated.name, updated.event_types) == ("renamed", ["batch.expired", "batch.failed"])
        assert updated.signing_secret_hint == f"whsec_…{created.signing_secret[-4:]}"
        assert sdk(server.base_url, alice).webhooks.delete(created.id).deleted is True
        with pytest.raises(openai.NotFoundError):
            ops.webhooks.retrieve(created.id)

        # An admin key manages another project's endpoints by naming it; a member cannot.
        for_bob = ops.webhooks.create(
            name="b",
            url="https://93.184.216.34/bob",
            event_types=["batch.completed"],
            extra_body={"project": "bob"},
        )
        assert [e.id for e in sdk(server.base_url, bob).webhooks.list().data] == [for_bob.id]
        ops.webhooks.create(name="o", url="https://93.184.216.34/ops", event_types=ALL_EVENTS)
        only_bob = ops.webhooks.list(extra_query={"project": "bob"}).data
        assert [e.id for e in only_bob] == [for_bob.id]
        assert len(ops.webhooks.list().data) == 2
        with pytest.raises(openai.PermissionDeniedError, match="Only an admin key"):
            sdk(server.base_url, alice).webhooks.create(
                name="x",
                url="https://93.184.216.34/x",
                event_types=ALL_EVENTS,
                extra_body={"project": "bob"},
            )
        with pytest.raises(openai.PermissionDeniedError):
            sdk(server.base_url, alice).webhooks.list(extra_query={"project": "bob"})
        with pytest.raises(openai.NotFoundError, match="No such project"):
            ops.webhooks.list(extra_query={"project": "nope"})


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.8/",
        "http://169.254.169.254/latest",
        "http://[::1]:8080/",
        "http://localhost/",
    ],
)
def test_private_targets_are_refused_at_delivery_too(url: str) -> None:
    with pytest.raises(TargetRefused, match="loopback or private"):
        pin(url, allow_private=False)
    assert pin(url, allow_private=True).url.startswith("http://")


def test_an_ipv4_address_inside_ipv6_is_judged_as_itself() -> None:
    for private in (
        "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud metadata service
        "2002:a9fe:a9fe::1",  # 6to4 of the same
        "2002:a00:1::1",  # 6to4 of 10.0.0.1
        "64:ff9b:1::a00:1",  # a network's own NAT64 (RFC 8215)
    ):
        with pytest.raises(TargetRefused, match="loopback or private"):
            pin(f"http://[{private}]/latest", allow_private=False)
    for public in ("64:ff9b::808:808", "2002:808:808::1", "::ffff:8.8.8.8"):
        assert pin(f"https://[{public}]/hook", allow_private=False).host == public


def test_a_pinned_target_keeps_its_host_for_the_header() -> None:
    target = pin("https://93.184.216.34:8443/a?b=1", allow_private=False)
    assert (target.url, target.host_header) == (
        "https://93.184.216.34:8443/a?b=1",
        "93.184.216.34:8443",
    )
    local = pin("http://localhost:9/h", allow_private=True)
    assert local.host_header == "localhost:9" and local.url.endswith(":9/h")


def test_send_test_event(fast: Settings, receiver: Receiver) -> None:
    receiver.answer = lambda _n: 204
    with running_server(fast) as server:
        client = sdk(server.base_url)
        endpoint = client.webhooks.create(name="t", url=receiver.url, event_types=ALL_EVENTS)
        result = client.webhooks.test(endpoint.id, event_type="batch.expired")
        assert (result.status_code, result.event_type) == (204, "batch.expired")
        event = unwrap(endpoint.signing_secret, receiver.received[0])
        assert isinstance(event, BatchExpiredWebhookEvent) and event.data.id == "batch_test"
        client.webhooks.update(endpoint.id, url="http://127.0.0.1:1/nobody-listens")
        with pytest.raises(openai.BadRequestError, match="could not be delivered") as down:
            client.webhooks.test(endpoint.id, event_type="batch.completed")
        assert down.value.code == "webhook_unreachable"
        rows = client.get(
            f"/webhook_endpoints/{endpoint.id}/deliveries", cast_to=httpx.Response
        ).json()["data"]
        assert [(r["event_type"], r["status"]) for r in rows] == [
            ("batch.completed", "failed"),
            ("batch.expired", "delivered"),
        ]
        assert "ConnectError" in rows[0]["last_error"]


def test_the_cli_manages_endpoints(
    fast: Settings, receiver: Receiver, capsys: pytest.CaptureFixture[str]
) -> None:
    with running_server(fast) as server:

        def overnight(*args: str) -> tuple[int, str, str]:
            code = main([*args, "--base-url", server.base_url, "--api-key", "sk-test"])
            out = capsys.readouterr()
            return code, out.out, out.err

        code, secret, err = overnight("webhooks", "create", receiver.url, "--name", "nightly")
        assert code == 0 and secret.strip().startswith("whsec_")
        endpoint_id = err.split(":")[0]
        code, listed, _ = overnight("webhooks", "list", "--json")
        (row,) = json.loads(listed)
        assert (row["id"], row["name"], row["event_types"]) == (
            endpoint_id,
            "nightly",
            sorted(ALL_EVENTS),
        )
        code, listed, _ = overnight("webhooks", "list", "--project", DEFAULT_PROJECT, "--json")
        assert code == 0 and [r["id"] for r in json.loads(listed)] == [endpoint_id]
        code, _, err = overnight("webhooks", "create", receiver.url, "--project", "nope")
        assert code == 1 and "No such project: 'nope'" in err
        code, out, _ = overnight("webhooks", "test", endpoint_id, "--event", "batch.failed")
        assert (code, out.strip()) == (0, f"batch.failed sent to {endpoint_id}: HTTP 200")
        assert unwrap(secret.strip(), receiver.received[0]).type == "batch.failed"
        code, out, _ = overnight("webhooks", "deliveries", endpoint_id)
        assert code == 0 and "batch.failed" in out and "delivered" in out
        code, out, _ = overnight("webhooks", "update", endpoint_id, "--enabled", "no")
        assert code == 0 and json.loads(out)["enabled"] is False
        code, rotated, _ = overnight("webhooks", "rotate-secret", endpoint_id)
        assert code == 0 and rotated.strip() != secret.strip()
        code, _, err = overnight("webhooks", "create", "ftp://example.com/")
        assert code == 1 and "http:// or https://" in err
        code, out, _ = overnight("webhooks", "rm", endpoint_id)
        assert (code, out.strip()) == (0, f"{endpoint_id} deleted")
