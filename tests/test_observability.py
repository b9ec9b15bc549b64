"""Health probes, Prometheus metrics, structured logs and the admin API."""

import io
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

from app.config import Settings
from app.db.models import Batch, File
from app.db.session import session_scope
from app.ids import new_batch_id
from app.logging import JsonFormatter, access_log
from app.services import online_usage
from app.services.auth import ensure_project
from tests import batch_sim
from tests.harness import RunningServer, running_server
from worker import registry
from worker.engine_gauges import EngineStats


def metrics(http: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def wait_status(client: openai.OpenAI, batch_id: str, status: str) -> None:
    deadline = time.monotonic() + 30
    while client.batches.retrieve(batch_id).status != status:
        assert time.monotonic() < deadline, f"{batch_id} never became {status}"
        time.sleep(0.05)


def test_health_and_readiness(http: httpx.Client, settings: Settings) -> None:
    assert http.get("/healthz").json() == {"status": "ok"}
    ready = http.get("/readyz")
    assert ready.status_code == 200
    assert ready.json() == {
        "status": "ok",
        "access": "open",
        "checks": {"database": "ok", "storage": "ok"},
    }
    assert "x-request-id" in ready.headers
    # Storage that cannot write: the temp folder has become a file.
    tmp = settings.storage_dir / ".tmp"
    shutil.rmtree(tmp)
    tmp.write_text("in the way")
    broken = http.get("/readyz")
    assert broken.status_code == 503
    body = broken.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["database"] == "ok"
    assert body["checks"]["storage"].startswith("error:")
    assert str(settings.data_dir) not in broken.text  # details stay in the log
    assert http.get("/healthz").status_code == 200  # alive, just not ready
    tmp.unlink()
    tmp.mkdir()
    assert http.get("/readyz").status_code == 200


def test_metrics_follow_batches_and_workers(
    http: httpx.Client, client: openai.OpenAI, settings: Settings
) -> None:
    before = metrics(http)
    queue = ("overnight_queue_requests", (("model", batch_sim.MODEL),))
    # Every served model has a queue series, 0 when nothing waits for it.
    assert {labels for name, labels in before if name == queue[0]} == {
        (("model", m.name),) for m in settings.models
    }
    assert before[queue] == 0
    assert before[("overnight_batches", (("api", "openai"), ("status", "in_progress")))] == 0
    assert not any(name == "overnight_requests_total" for name, _labels in before)
    assert not any(name.endswith("_created") for name, _labels in before)

    settings = settings.model_copy(update={"shard_lines": 4})
    f = client.files.create(file=("in.jsonl", batch_sim.requests_file(10)), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(client, batch.id, "in_progress")
    total = client.batches.retrieve(batch.id).request_counts
    assert total is not None and total.total == 10
    claim = batch_sim.claim_shard(settings, "metrics-worker", batch.id)
    assert claim is not None
    written = batch_sim.run_shard(settings, claim, limit=3)
    with session_scope(settings) as session:
        registry.register(session, "w-1", batch_sim.MODEL)
        registry.heartbeat(session, "w-1", claim.shard_id, 42.5, EngineStats(3, 5, 0.25))

    now = metrics(http)
    assert now[("overnight_batches", (("api", "openai"), ("status", "in_progress")))] == 1
    assert now[queue] == 10 - written
    assert now[("overnight_queue_requests", (("model", "all-MiniLM-L6-v2"),))] == 0
    live = client.batches.retrieve(batch.id).request_counts
    assert live is not None
    model = ("model", batch_sim.MODEL)
    assert now[("overnight_requests_total", (model, ("outcome", "completed")))] == live.completed
    assert now[("overnight_requests_total", (model, ("outcome", "failed")))] == live.failed
    usage = client.batches.retrieve(batch.id).usage
    assert usage is not None
    assert now[("overnight_tokens_total", (("kind", "prompt"), model))] == usage.input_tokens
    assert now[("overnight_tokens_total", (("kind", "generated"), model))] == usage.output_tokens
    cached = usage.input_tokens_details.cached_tokens
    assert cached > 0 and now[("overnight_tokens_total", (("kind", "cached"), model))] == cached
    # The batch waited in the queue once and has not ended.
    assert now[("overnight_batch_queue_wait_seconds_count", (model,))] == 1
    assert now[("overnight_batch_queue_wait_seconds_bucket", (("le", "+Inf"), model))] == 1
    assert ("overnight_batch_duration_seconds_count", (model,)) not in now
    assert not any(name.endswith("_created") for name, _labels in now)
    worker = (("model", batch_sim.MODEL), ("worker", "w-1"))
    assert now[("overnight_worker_tokens_per_second", worker)] == 42.5
    assert now[("overnight_worker_busy", worker)] == 1
    assert now[("overnight_worker_engine_running_requests", worker)] == 3
    assert now[("overnight_worker_engine_waiting_requests", worker)] == 5
    assert now[("overnight_worker_kv_cache_usage_ratio", worker)] == 0.25
    assert now[("overnight_workers", (("model", batch_sim.MODEL),))] == 1
    # Latency is labelled by route template, never by raw id.
    routes = {
        dict(labels).get("route") for (name, labels) in now if name.startswith("overnight_http")
    }
    assert "/v1/batches/{batch_id}" in routes
    assert not any(batch.id in (r or "") for r in routes)


def test_metrics_count_message_batches_apart(http: httpx.Client, client: openai.OpenAI) -> None:
    hello = {
        "model": batch_sim.MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
    }
    created = http.post(
        "/v1/messages/batches", json={"requests": [{"custom_id": "m", "params": hello}]}
    )
    assert created.status_code == 200, created.text
    wait_status(client, created.json()["id"], "in_progress")
    now = metrics(http)
    assert now[("overnight_batches", (("api", "anthropic"), ("status", "in_progress")))] == 1
    assert now[("overnight_batches", (("api", "openai"), ("status", "in_progress")))] == 0


def test_metrics_name_no_batch_or_project_unless_asked(
    http: httpx.Client, client: openai.OpenAI, settings: Settings
) -> None:
    f = client.files.create(file=("in.jsonl", batch_sim.requests_file(4)), purpose="batch")
    batch = client.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(client, batch.id, "in_progress")
    claim = batch_sim.claim_shard(settings, "metrics-worker", batch.id)
    assert claim is not None
    batch_sim.run_shard(settings, claim, limit=2)
    used = SimpleNamespace(requests=1, input_tokens=10, cached_tokens=2, output_tokens=5)
    with session_scope(settings) as session:
        for name in ("team-alpha", "team-beta"):
            project_id = ensure_project(session, name).id
            online_usage.add(session, batch_sim.MODEL, {project_id: used})

    exposition = http.get("/metrics").text
    assert batch.id not in exposition and "team-" not in exposition
    now = metrics(http)
    model = ("model", batch_sim.MODEL)
    assert now[("overnight_online_requests_total", (model,))] == 2  # summed over projects
    assert now[("overnight_online_tokens_total", (("kind", "prompt"), model))] == 20
    [rate] = [labels for (name, labels) in now if name == "overnight_batch_throughput"]
    assert dict(rate) == {"model": batch_sim.MODEL, "unit": "tok/s"}

    shown = settings.model_copy(update={"metrics_per_batch": True})
    with running_server(shown) as server:
        detailed = httpx.get(f"{server.url}/metrics", timeout=30).text
    assert f'batch="{batch.id}"' in detailed and 'project="team-alpha"' in detailed


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    access_log.addHandler(handler)
    old_level = access_log.level
    access_log.setLevel(logging.INFO)
    try:
        yield stream
    finally:
        access_log.removeHandler(handler)
        access_log.setLevel(old_level)


def test_access_log_is_json_with_the_request_id(
    http: httpx.Client, captured_logs: io.StringIO
) -> None:
    response = http.get("/v1/files/file-nope")
    assert response.status_code == 404
    lines = [orjson.loads(line) for line in captured_logs.getvalue().splitlines()]
    entry = next(e for e in lines if e.get("path") == "/v1/files/file-nope")
    assert entry["request_id"] == response.headers["x-request-id"]
    assert entry["status"] == 404
    assert entry["method"] == "GET"
    assert entry["level"] == "info"
    assert entry["duration_ms"] >= 0


def test_json_formatter_keeps_extras_and_exceptions() -> None:
    try:
        raise ValueError("boom <b>")
    except ValueError:
        record = logging.getLogger("t").makeRecord(
            "t", logging.ERROR, __file__, 1, "failed %s", ("x",), sys.exc_info(), extra={"n": 3}
        )
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["message"] == "failed x"
    assert entry["n"] == 3
    assert "ValueError: boom <b>" in entry["exception"]
    assert "request_id" not in entry


def _sdk(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def test_admin_api_manages_keys(server: RunningServer, settings: Settings) -> None:
    open_client = _sdk(server, "anything")
    admin = open_client.post(
        "/admin/api_keys", body={"project": "ops", "role": "admin"}, cast_to=dict
    )
    assert admin["value"].startswith("sk-ovn-") and admin["role"] == "admin"
    # Keys exist now: the open client is refused, the admin key lists them.
    with pytest.raises(openai.AuthenticationError):
        open_client.get("/admin/api_keys", cast_to=dict)
    admin_client = _sdk(server, admin["value"])
    member = admin_client.post(
        "/admin/api_keys", body={"project": "<b>team</b>", "name": "ci"}, cast_to=dict
    )
    listed = admin_client.get("/admin/api_keys", cast_to=dict)
    assert {k["id"] for k in listed["data"]} == {admin["id"], member["id"]}
    assert all("value" not in k for k in listed["data"])
    assert member["project_name"] == "<b>team</b>"
    only = admin_client.get(
        "/admin/api_keys", options={"params": {"project": "<b>team</b>"}}, cast_to=dict
    )
    assert [k["id"] for k in only["data"]] == [member["id"]]
    projects = admin_client.get("/admin/projects", cast_to=dict)
    assert {"ops", "<b>team</b>"} <= {p["name"] for p in projects["data"]}

    member_client = _sdk(server, member["value"])
    assert member_client.files.list().data == []
    with pytest.raises(openai.PermissionDeniedError):
        member_client.get("/admin/api_keys", cast_to=dict)
    with pytest.raises(openai.BadRequestError):
        admin_client.post("/admin/api_keys", body={"project": ""}, cast_to=dict)
    with pytest.raises(openai.NotFoundError):
        admin_client.delete("/admin/api_keys/key_nope", cast_to=dict)

    revoked = admin_client.delete(f"/admin/api_keys/{member['id']}", cast_to=dict)
    assert revoked == {"object": "api_key.revoked", "id": member["id"], "revoked": True}
    with pytest.raises(openai.AuthenticationError):
        member_client.files.list()
    assert [k["id"] for k in admin_client.get("/admin/api_keys", cast_to=dict)["data"]] == [
        admin["id"]
    ]

    with session_scope(settings) as session:
        registry.register(session, "gpu-1:7:abc", "SmolLM2-135M-Instruct")
    workers = admin_client.get("/admin/workers", cast_to=dict)["data"]
    assert [(w["id"], w["state"], w["model"]) for w in workers] == [
        ("gpu-1:7:abc", "idle", "SmolLM2-135M-Instruct")
    ]


def test_batch_durations_are_histograms_by_model(http: httpx.Client, settings: Settings) -> None:
    file_id = batch_sim.store_input_file(settings, batch_sim.requests_file(2))
    now = int(time.time())
    with session_scope(settings) as session:
        project_id = session.scalar(select(File.project_id).where(File.id == file_id))
        for ran in (10, 100, 4000):
            session.add(
                Batch(
                    id=new_batch_id(),
                    project_id=project_id,
                    endpoint=batch_sim.CHAT,
                    input_file_id=file_id,
                    model=batch_sim.MODEL,
                    completion_window="24h",
                    status="completed",
                    created_at=now - ran - 2,
                    in_progress_at=now - ran,
                    completed_at=now,
                    expires_at=now + 86400,
                )
            )
    seen = metrics(http)
    model = ("model", batch_sim.MODEL)
    duration = "overnight_batch_duration_seconds"
    assert seen[(f"{duration}_count", (model,))] == 3
    assert seen[(f"{duration}_sum", (model,))] == 12 + 102 + 4002
    assert seen[(f"{duration}_bucket", (("le", "15.0"), model))] == 1
    assert seen[(f"{duration}_bucket", (("le", "300.0"), model))] == 2
    assert seen[(f"{duration}_bucket", (("le", "3600.0"), model))] == 2
    assert seen[(f"{duration}_bucket", (("le", "+Inf"), model))] == 3
    wait = "overnight_batch_queue_wait_seconds"
    assert seen[(f"{wait}_sum", (model,))] == 6
    assert seen[(f"{wait}_bucket", (("le", "1.0"), model))] == 0
    assert seen[(f"{wait}_bucket", (("le", "5.0"), model))] == 3


def test_json_lines_carry_no_ansi_colour_copy() -> None:
    record = logging.getLogger("uvicorn.error").makeRecord(
        "uvicorn.error",
        logging.INFO,
        __file__,
        1,
        "Started server process [%d]",
        (7,),
        None,
        extra={"color_message": "Started server process [\x1b[36m%d\x1b[0m]"},
    )
    entry = orjson.loads(JsonFormatter().format(record))
    assert entry["message"] == "Started server process [7]"
    assert "color_message" not in entry
