"""The Batches API end to end: official SDK (strict) and raw HTTP, on SQLite and PostgreSQL.

A stand-in worker (`tests.batch_sim`) plays the worker's side of the batch contract;
validation and finalization run in the real server's housekeeping loop.
"""

import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import orjson
import pytest
from sqlalchemy import select, update

from app.config import Settings
from app.db.models import Batch, File, Shard
from app.db.session import session_factory, session_scope
from app.ids import new_batch_id
from app.schemas.batches import CreateBatchRequest
from app.services import batches as service
from app.services.auth import DEFAULT_PROJECT, create_key, ensure_project
from app.services.steps.finalization import finalize_ready_batches
from app.services.steps.validation import validate_pending
from tests import batch_sim as sim
from tests.forms import JSON_TYPE
from tests.harness import RunningServer, running_server
from tests.spec import assert_error, assert_matches_schema

N = 23  # requests per test file: three shards of 10, 10 and 3


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    fast = settings.model_copy(
        update={"shard_lines": 10, "housekeeping_interval_seconds": 0.2, "lease_seconds": 3.0}
    )
    with running_server(fast) as running:
        yield running


def upload(client: openai.OpenAI, data: bytes, name: str = "requests.jsonl") -> str:
    return client.files.create(file=(name, data, "application/jsonl"), purpose="batch").id


def wait_for(
    client: openai.OpenAI, batch_id: str, *statuses: str, timeout: float = 20
) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        assert time.monotonic() < deadline, f"{batch_id} stayed {batch.status}"
        time.sleep(0.05)


def read_lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]


def custom_ids(n: int = N) -> list[str]:
    return [f"req-{i}" for i in range(n)]


def check_files_match_counts(client: openai.OpenAI, batch: openai.types.Batch) -> tuple[list, list]:
    """Every custom_id once, in input order within each file, counts and usage as written."""
    output = read_lines(client, batch.output_file_id)
    errors = read_lines(client, batch.error_file_id)
    every = [line["custom_id"] for line in output + errors]
    assert sorted(every) == sorted(custom_ids(batch.request_counts.total))
    order = {cid: i for i, cid in enumerate(custom_ids(batch.request_counts.total))}
    for lines in (output, errors):
        positions = [order[line["custom_id"]] for line in lines]
        assert positions == sorted(positions)
        assert all(line["id"].startswith("batch_req_") for line in lines)
    assert batch.request_counts.completed == len(output)
    assert batch.request_counts.failed == len(errors)
    assert all(line["response"]["status_code"] == 200 and not line["error"] for line in output)
    usages = [line["response"]["body"]["usage"] for line in output]
    usage = batch.usage
    assert usage is not None
    assert usage.input_tokens == sum(u["prompt_tokens"] for u in usages)
    assert usage.output_tokens == sum(u["completion_tokens"] for u in usages)
    assert usage.input_tokens_details.cached_tokens == sum(
        u["prompt_tokens_details"]["cached_tokens"] for u in usages
    )
    assert usage.output_tokens_details.reasoning_tokens == len(usages)
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    return output, errors


def test_full_lifecycle(client: openai.OpenAI, server: RunningServer, http: httpx.Client) -> None:
    settings = server.settings
    file_id = upload(client, sim.requests_file(N))
    created = client.batches.create(
        input_file_id=file_id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"purpose": "nightly eval"},
        output_expires_after={"anchor": "created_at", "seconds": 7200},
    )
    assert created.status == "validating" and created.object == "batch"
    assert created.expires_at == created.created_at + 24 * 3600
    assert created.request_counts is not None and created.request_counts.total == 0
    assert created.metadata == {"purpose": "nightly eval"}

    running = wait_for(client, created.id, "in_progress")
    assert running.model == sim.MODEL and running.in_progress_at is not None
    assert running.request_counts is not None and running.request_counts.total == N

    # Live counts: one shard finished and persisted, the others not started.
    claim = sim.claim_shard(settings, "sim", created.id)
    assert claim is not None
    sim.run_shard(settings, claim)
    live = client.batches.retrieve(created.id)
    assert live.status == "in_progress" and live.request_counts is not None
    assert live.request_counts.completed + live.request_counts.failed == 10
    assert live.usage is not None and live.usage.input_tokens > 0
    assert_matches_schema(http.get(f"/v1/batches/{created.id}").json(), "Batch")

    assert sim.run_batch(settings, created.id) == 2
    done = wait_for(client, created.id, "completed")
    assert done.finalizing_at is not None and done.completed_at is not None
    assert (done.failed_at, done.cancelled_at, done.expired_at, done.errors) == (None,) * 4
    assert done.request_counts is not None and done.request_counts.total == N
    output, errors = check_files_match_counts(client, done)
    assert output and errors  # the stand-in worker fails every seventh request with a 400
    assert all(line["response"]["status_code"] == 400 for line in errors)
    assert live.request_counts.completed <= done.request_counts.completed

    for file_id, side in ((done.output_file_id, "output"), (done.error_file_id, "error")):
        assert file_id is not None
        info = client.files.retrieve(file_id)
        assert info.purpose == "batch_output" and info.filename == f"{done.id}_{side}.jsonl"
        assert info.expires_at == info.created_at + 7200
    listed = {f.id for f in client.files.list(purpose="batch_output")}
    assert {done.output_file_id, done.error_file_id} <= listed
    assert_matches_schema(http.get(f"/v1/batches/{done.id}").json(), "Batch")


def test_batch_objects_have_every_key_and_match_the_official_schema(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    file_id = upload(client, sim.requests_file(3))
    body = {"input_file_id": file_id, "endpoint": "/v1/completions", "completion_window": "24h"}
    # Open mode takes JSON bodies as application/json only (keyed mode: any Content-Type).
    response = http.post("/v1/batches", content=orjson.dumps(body), headers=JSON_TYPE)
    assert response.status_code == 200 and response.headers["x-request-id"].startswith("req_")
    created = response.json()
    assert_matches_schema(created, "Batch")
    expected_keys = set(openai.types.Batch.model_fields)
    assert set(created) == expected_keys
    assert created["output_file_id"] is None and created["cancelled_at"] is None
    assert created["usage"] == {
        "input_tokens": 0,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 0,
    }
    # a chat model on /v1/completions lines with chat urls fails validation, listing the lines
    failed = wait_for(client, created["id"], "failed")
    assert failed.failed_at is not None and failed.errors is not None
    assert [(e.code, e.line) for e in failed.errors.data or []] == [
        ("url_mismatch", n) for n in (1, 2, 3)
    ]
    raw = http.get(f"/v1/batches/{created['id']}").json()
    assert_matches_schema(raw, "Batch")
    assert raw["errors"]["object"] == "list"
    assert_matches_schema(http.get("/v1/batches").json(), "ListBatchesResponse")
    cancelled = http.post(f"/v1/batches/{created['id']}/cancel")
    assert_error(cancelled, 409, message="Cannot cancel a batch with status 'failed'.")


def test_list_pages_newest_first_across_250_batches(
    client: openai.OpenAI, server: RunningServer, http: httpx.Client
) -> None:
    settings = server.settings
    file_id = upload(client, sim.requests_file(1))
    params = CreateBatchRequest(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with session_factory(settings.sqlalchemy_url)() as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        session.commit()
        created = [
            service.create_batch(session, settings, project_id, params).id for _ in range(250)
        ]
        session.commit()  # services never commit: their caller does
    newest_first = created[::-1]

    assert [b.id for b in client.batches.list(limit=100)] == newest_first  # SDK auto-paging
    default_page = client.batches.list()
    assert [b.id for b in default_page.data] == newest_first[:20] and default_page.has_more

    pages, after = [], None
    while True:
        params_q: dict[str, Any] = {"limit": 100} | ({"after": after} if after else {})
        page = http.get("/v1/batches", params=params_q).json()
        pages.append(page)
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert [len(p["data"]) for p in pages] == [100, 100, 50]
    assert [p["has_more"] for p in pages] == [True, True, False]
    assert [b["id"] for p in pages for b in p["data"]] == newest_first
    assert all(p["first_id"] == p["data"][0]["id"] for p in pages)
    assert all(p["last_id"] == p["data"][-1]["id"] for p in pages)
    empty = http.get("/v1/batches", params={"after": newest_first[-1]}).json()
    assert empty["data"] == [] and empty["has_more"] is False
    for limit in (0, 101):
        assert_error(http.get("/v1/batches", params={"limit": limit}), 400, param="limit")


def _sdk_error(call: Callable[[], object]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        call()
    return info.value


def test_create_time_errors(
    client: openai.OpenAI, server: RunningServer, http: httpx.Client
) -> None:
    file_id = upload(client, sim.requests_file(2))
    good = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    bad_cases: list[tuple[dict[str, Any], int, str | None, str]] = [
        ({"endpoint": "/v1/moderations"}, 400, "endpoint", "/v1/responses, /v1/chat/completions"),
        ({"endpoint": "/v1/images/generations"}, 400, "endpoint", "/v1/embeddings"),
        ({"completion_window": "48h"}, 400, "completion_window", "'24h'"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata", "16"),
        ({"metadata": {"k" * 65: "v"}}, 400, "metadata", "64"),
        ({"metadata": {"k": "v" * 513}}, 400, "metadata.k", "512"),
        ({"metadata": {"k": 5}}, 400, "metadata.k", ""),
        (
            {"output_expires_after": {"anchor": "created_at", "seconds": 3599}},
            400,
            "output_expires_after.seconds",
            "",
        ),
        (
            {"output_expires_after": {"anchor": "created_at", "seconds": 2_592_001}},
            400,
            "output_expires_after.seconds",
            "",
        ),
        (
            {"output_expires_after": {"anchor": "completed_at", "seconds": 3600}},
            400,
            "output_expires_after.anchor",
            "",
        ),
        ({"input_file_id": "file-doesnotexist"}, 404, "input_file_id", "No such File object"),
    ]
    for change, status, param, message in bad_cases:
        assert_error(
            http.post("/v1/batches", json=good | change), status, param=param, message=message
        )
    for missing in ("input_file_id", "endpoint", "completion_window"):
        body = {k: v for k, v in good.items() if k != missing}
        error = assert_error(http.post("/v1/batches", json=body), 400, param=missing)
        assert error["code"] == "missing_required_parameter"
    assert_error(http.post("/v1/batches", content=b"{nope", headers=JSON_TYPE), 400)
    # the limits themselves are accepted
    edge = good | {
        "metadata": {f"{i:064d}": "v" * 512 for i in range(16)},
        "output_expires_after": {"anchor": "created_at", "seconds": 3600},
    }
    assert http.post("/v1/batches", json=edge).status_code == 200

    other = client.files.create(file=("notes.txt", b"hello", "text/plain"), purpose="user_data")
    error = _sdk_error(
        lambda: client.batches.create(
            input_file_id=other.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    )
    assert isinstance(error, openai.BadRequestError) and error.param == "input_file_id"
    assert "purpose" in str(error.message)
    assert isinstance(
        _sdk_error(lambda: client.batches.retrieve("batch_nope")), openai.NotFoundError
    )
    assert isinstance(_sdk_error(lambda: client.batches.cancel("batch_nope")), openai.NotFoundError)


def test_objects_of_another_project_are_invisible(server: RunningServer) -> None:
    with session_scope(server.settings) as session:
        _, key_a = create_key(session, "project-a")
        _, key_b = create_key(session, "project-b")
    kwargs: dict[str, Any] = {"base_url": server.base_url, "max_retries": 0}
    with (
        openai.OpenAI(api_key=key_a, _strict_response_validation=True, **kwargs) as a,
        openai.OpenAI(api_key=key_b, _strict_response_validation=True, **kwargs) as b,
    ):
        file_id = upload(a, sim.requests_file(2))
        error = _sdk_error(
            lambda: b.batches.create(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        )
        assert isinstance(error, openai.NotFoundError) and error.param == "input_file_id"
        batch = a.batches.create(
            input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert isinstance(_sdk_error(lambda: b.batches.retrieve(batch.id)), openai.NotFoundError)
        assert isinstance(_sdk_error(lambda: b.batches.cancel(batch.id)), openai.NotFoundError)
        assert [x.id for x in b.batches.list()] == []
        assert [x.id for x in a.batches.list()] == [batch.id]
        assert [x.id for x in a.batches.list(after=batch.id)] == []  # a known cursor, last page
    with httpx.Client(
        timeout=60, base_url=server.url, headers={"authorization": f"Bearer {key_b}"}
    ) as http:
        # Another project's batch is as unknown a cursor as a made-up id.
        for after in (batch.id, "batch_nonexistent"):
            response = http.get("/v1/batches", params={"after": after})
            error = assert_error(response, 400, param="after")
            assert error["code"] == "invalid_value"
            assert (
                error["message"] == f"Invalid 'after': no object with id '{after}' to page after."
            )


# --- cancellation ------------------------------------------------------------------------


def _set(settings: Settings, batch_id: str, **values: Any) -> None:
    with session_scope(settings) as session:
        session.execute(update(Batch).where(Batch.id == batch_id).values(**values))


def _create(client: openai.OpenAI, n: int = N) -> str:
    file_id = upload(client, sim.requests_file(n))
    return client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    ).id


def _validating_batch(settings: Settings, file_id: str, expires_in: int) -> str:
    """A `validating` batch that another validator holds, as if reading a large file."""
    project_id = _project_of(settings, file_id)
    now = int(time.time())
    batch_id = new_batch_id()
    with session_scope(settings) as session:
        session.add(
            Batch(
                id=batch_id,
                project_id=project_id,
                endpoint=sim.CHAT,
                input_file_id=file_id,
                completion_window="24h",
                status="validating",
                created_at=now,
                expires_at=now + expires_in,
                lease_owner="slow-validator",
                lease_epoch=1,
                heartbeat_at=time.time(),
            )
        )
    return batch_id


def _assert_ended_unread(batch: openai.types.Batch) -> None:
    """As at OpenAI: a batch whose input was never read counts no request and has no file."""
    assert batch.in_progress_at is None
    assert (batch.output_file_id, batch.error_file_id) == (None, None)
    counts = batch.request_counts
    assert counts is not None and (counts.total, counts.completed, counts.failed) == (0, 0, 0)
    assert counts.model_extra == {"cancelled": 0, "expired": 0}


def test_cancel_while_validating(client: openai.OpenAI, server: RunningServer) -> None:
    file_id = upload(client, sim.requests_file(N))
    batch_id = _validating_batch(server.settings, file_id, 86400)
    cancelling = client.batches.cancel(batch_id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    time.sleep(0.5)
    assert client.batches.retrieve(batch_id).status == "cancelling"  # its lease is respected
    _set(server.settings, batch_id, lease_owner=None, heartbeat_at=None)  # the validator lets go
    cancelled = wait_for(client, batch_id, "cancelled")
    assert cancelled.cancelled_at is not None
    _assert_ended_unread(cancelled)


def test_a_batch_that_expires_while_validating_is_not_validated_after(settings: Settings) -> None:
    """Its validator died and the window closed meanwhile: the next validator leaves it, and
    it ends `expired` as it is, like a batch cancelled while validating (not with a
    `batch_expired` line for each request it never had a chance to run)."""
    idle = settings.model_copy(update={"housekeeping_interval_seconds": 3600})
    with (
        running_server(idle) as server,
        openai.OpenAI(
            base_url=server.base_url, api_key="sk", max_retries=0, _strict_response_validation=True
        ) as client,
    ):
        file_id = upload(client, sim.requests_file(N))
        batch_id = _validating_batch(server.settings, file_id, -1)
        _set(server.settings, batch_id, lease_owner=None, heartbeat_at=None)  # the holder died
        # The housekeeping steps, in the order that let an expired batch be validated.
        assert validate_pending(server.settings, "validator") == 0
        assert finalize_ready_batches(server.settings, "finalizer") == 1
        expired = client.batches.retrieve(batch_id)
        assert expired.status == "expired" and expired.expired_at is not None
        _assert_ended_unread(expired)


def _project_of(settings: Settings, file_id: str) -> str:
    with session_scope(settings) as session:
        project_id = session.scalar(select(File.project_id).where(File.id == file_id))
        assert project_id is not None
        return project_id


def test_cancel_in_progress_with_no_worker(client: openai.OpenAI) -> None:
    batch_id = _create(client)
    wait_for(client, batch_id, "in_progress")
    assert client.batches.cancel(batch_id).status in ("cancelling", "cancelled")
    cancelled = wait_for(client, batch_id, "cancelled")
    assert cancelled.output_file_id is None
    output, errors = check_files_match_counts(client, cancelled)
    assert output == [] and len(errors) == N
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert all(line["response"] is None for line in errors)
    assert (
        errors[0]["error"]["message"] == "This request was cancelled before it could be executed."
    )


def test_cancel_in_progress_keeps_finished_results(
    client: openai.OpenAI, server: RunningServer
) -> None:
    batch_id = _create(client)
    wait_for(client, batch_id, "in_progress")
    claim = sim.claim_shard(server.settings, "sim", batch_id)
    assert claim is not None
    sim.run_shard(server.settings, claim)  # the first shard: 10 requests
    partial = sim.claim_shard(server.settings, "sim", batch_id)
    assert partial is not None
    sim.run_shard(server.settings, partial, limit=4)  # 4 requests of the second shard
    # The second shard's holder is alive: the batch stays cancelling until it lets go.
    assert client.batches.cancel(batch_id).status == "cancelling"
    time.sleep(0.5)
    again = client.batches.cancel(batch_id)  # cancelling a cancelling batch: 200, unchanged
    assert again.status == "cancelling" and again.request_counts is not None
    assert again.request_counts.completed + again.request_counts.failed == 14
    _release_shards(server.settings, batch_id)
    cancelled = wait_for(client, batch_id, "cancelled")
    output, errors = check_files_match_counts(client, cancelled)
    ran = [line for line in output + errors if line["response"] is not None]
    assert len(ran) == 14
    unrun = [line for line in errors if line["error"] is not None]
    assert len(unrun) == N - 14 and {e["error"]["code"] for e in unrun} == {"batch_cancelled"}
    assert client.batches.cancel(batch_id).status == "cancelled"  # still 200


def _release_shards(settings: Settings, batch_id: str) -> None:
    with session_scope(settings) as session:
        session.execute(
            update(Shard)
            .where(Shard.batch_id == batch_id, Shard.status == "running")
            .values(status="pending", lease_owner=None)
        )


def test_cancel_while_finalizing_changes_nothing(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """Every request has its result once a batch is finalizing: a cancel answers 200 with the
    batch as it is, and the batch completes with nothing counted as cancelled."""
    batch_id = _create(client)
    wait_for(client, batch_id, "in_progress")
    # A finalizer holds the batch (as if writing its files) when the cancel arrives.
    _set(server.settings, batch_id, lease_owner="finalizer", heartbeat_at=time.time())
    sim.run_batch(server.settings, batch_id)
    _set(server.settings, batch_id, status="finalizing", finalizing_at=int(time.time()))
    answered = client.batches.cancel(batch_id)
    assert answered.status == "finalizing" and answered.cancelling_at is None
    # That finalizer dies; after the lease lapses housekeeping takes over.
    _assert_completed_despite_the_cancel(client, batch_id)


def test_a_cancel_after_every_request_ran_still_completes(
    client: openai.OpenAI, server: RunningServer
) -> None:
    """The cancel reaches a batch whose last shard is done before its finalization starts:
    accepted (`cancelling`), yet the batch completes, its finished lines not cancelled."""
    batch_id = _create(client)
    wait_for(client, batch_id, "in_progress")
    _set(server.settings, batch_id, lease_owner="finalizer", heartbeat_at=time.time())
    sim.run_batch(server.settings, batch_id)
    assert client.batches.cancel(batch_id).status == "cancelling"
    done = _assert_completed_despite_the_cancel(client, batch_id)
    assert done.cancelling_at is not None and done.finalizing_at is not None


def _assert_completed_despite_the_cancel(
    client: openai.OpenAI, batch_id: str
) -> openai.types.Batch:
    done = wait_for(client, batch_id, "completed", "cancelled", timeout=30)
    assert done.status == "completed" and done.cancelled_at is None
    counts = done.request_counts
    assert counts is not None and counts.completed + counts.failed == N
    assert counts.model_extra == {"cancelled": 0, "expired": 0}
    output, errors = check_files_match_counts(client, done)
    assert all(line["error"] is None for line in errors)  # every request had run
    assert len(output) + len(errors) == N
    return done


def test_cancel_terminal_batches_is_a_conflict(
    client: openai.OpenAI, server: RunningServer, http: httpx.Client
) -> None:
    batch_id = _create(client, 3)
    wait_for(client, batch_id, "in_progress")
    sim.run_batch(server.settings, batch_id)
    wait_for(client, batch_id, "completed")
    for status in ("completed", "failed", "expired"):
        _set(server.settings, batch_id, status=status)
        response = http.post(f"/v1/batches/{batch_id}/cancel")
        error = assert_error(
            response, 409, message=f"Cannot cancel a batch with status '{status}'."
        )
        assert error["type"] == "invalid_request_error"
        assert response.headers["x-should-retry"] == "false"
        sdk_error = _sdk_error(lambda: client.batches.cancel(batch_id))
        assert isinstance(sdk_error, openai.ConflictError)
        assert client.batches.retrieve(batch_id).status == status


# --- expiry ------------------------------------------------------------------------------


def test_a_queued_batch_expires_without_a_worker(settings: Settings) -> None:
    short = settings.model_copy(
        update={
            "completion_windows": {"24h": 3},
            "shard_lines": 10,
            "housekeeping_interval_seconds": 0.2,
        }
    )
    with (
        running_server(short) as server,
        openai.OpenAI(
            base_url=server.base_url, api_key="sk", max_retries=0, _strict_response_validation=True
        ) as client,
    ):
        batch_id = _create(client)
        batch = wait_for(client, batch_id, "in_progress")
        assert batch.expires_at == batch.created_at + 3
        claim = sim.claim_shard(server.settings, "sim", batch_id)
        assert claim is not None
        sim.run_shard(server.settings, claim)  # one shard ran before the window closed
        expired = wait_for(client, batch_id, "expired", timeout=20)
        assert expired.expired_at is not None and expired.expired_at >= expired.expires_at
        assert expired.completed_at is None and expired.cancelled_at is None
        output, errors = check_files_match_counts(client, expired)
        unrun = [line for line in errors if line["error"] is not None]
        assert len(unrun) == N - 10
        assert {e["error"]["code"] for e in unrun} == {"batch_expired"}
        assert unrun[0]["error"]["message"] == (
            "This request could not be executed before the completion window expired."
        )
        assert len(output) + len(errors) - len(unrun) == 10
        assert _sdk_error(lambda: client.batches.cancel(batch_id)).status_code == 409


def test_retrieve_and_list_sum_a_running_batch_s_shards_and_show_a_finished_one_s_totals(
    client: openai.OpenAI, server: RunningServer, http: httpx.Client
) -> None:
    settings = server.settings
    file_id = upload(client, sim.requests_file(1))
    params = CreateBatchRequest(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    with session_scope(settings) as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        running, done, queued = (
            service.create_batch(session, settings, project_id, params).id for _ in range(3)
        )
        session.execute(update(Batch).where(Batch.id == running).values(status="in_progress"))
        session.execute(
            update(Batch)
            .where(Batch.id == done)
            .values(status="completed", total=9, completed=7, failed=2, input_tokens=70)
        )
        for batch_id in (running, done):
            for index, (ok, bad) in enumerate([(3, 1), (2, 0)]):
                session.add(
                    Shard(
                        batch_id=batch_id,
                        index=index,
                        first_line=1,
                        line_count=4,
                        byte_start=0,
                        byte_end=1,
                        status="running",
                        completed=ok,
                        failed=bad,
                        input_tokens=10 * ok,
                        output_tokens=ok,
                    )
                )

    def counts(batch: dict[str, Any]) -> tuple[int, int, int, int]:
        usage = batch["usage"]
        return (
            batch["request_counts"]["completed"],
            batch["request_counts"]["failed"],
            usage["input_tokens"],
            usage["total_tokens"],
        )

    listed = {b["id"]: b for b in http.get("/v1/batches").json()["data"]}
    for batch_id, expected in [
        (running, (5, 1, 50, 55)),  # the shards' sums
        (done, (7, 2, 70, 70)),  # its own totals, whatever its shards say
        (queued, (0, 0, 0, 0)),  # no shard yet
    ]:
        assert counts(listed[batch_id]) == expected
        assert counts(http.get(f"/v1/batches/{batch_id}").json()) == expected
    assert client.batches.retrieve(running).request_counts.completed == 5  # strict SDK shape
