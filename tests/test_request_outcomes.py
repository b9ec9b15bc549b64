"""Cancelled and expired requests are told apart from failed ones wherever a person reads counts."""

import time
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest
from sqlalchemy import update

from app.cli import main
from app.config import Settings
from app.core.progress import Outcomes
from app.db.models import Batch
from app.db.session import session_scope
from tests import batch_sim
from tests.fake_engine import fast
from tests.harness import RunningServer, running_server

ADMIN_KEY = "sk-admin-outcomes"


def test_outcomes_read_apart_from_openais_failed() -> None:
    outcomes = Outcomes.of_counts(completed=22, failed=380, cancelled=378, expired=0)
    assert (outcomes.failed, outcomes.cancelled) == (2, 378)
    assert str(outcomes) == "22 ok, 2 failed, 378 cancelled"
    assert str(Outcomes.of_counts(5, 3, 0, 3)) == "5 ok, 0 failed, 3 expired"


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    with running_server(fast(settings, admin_key=ADMIN_KEY, shard_lines=4)) as running:
        yield running


def wait_status(sdk: openai.OpenAI, batch_id: str, status: str) -> openai.types.Batch:
    deadline = time.monotonic() + 60
    while (batch := sdk.batches.retrieve(batch_id)).status != status:
        assert time.monotonic() < deadline, batch.status
        time.sleep(0.1)
    return batch


@pytest.mark.parametrize("ending", ["cancelled", "expired"])
def test_unrun_requests_are_counted_apart(
    server: RunningServer, ending: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sdk = openai.OpenAI(base_url=server.base_url, api_key=ADMIN_KEY, max_retries=0)
    f = sdk.files.create(file=("in.jsonl", batch_sim.requests_file(10)), purpose="batch")
    batch = sdk.batches.create(
        input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    wait_status(sdk, batch.id, "in_progress")
    claim = batch_sim.claim_shard(server.settings, "sim", batch.id)
    assert claim is not None
    assert batch_sim.run_shard(server.settings, claim) == 4
    if ending == "cancelled":
        sdk.batches.cancel(batch.id)
    else:
        with session_scope(server.settings) as session:
            past = int(time.time()) - 1
            session.execute(update(Batch).where(Batch.id == batch.id).values(expires_at=past))
    ended = wait_status(sdk, batch.id, ending)

    # OpenAI's counts stay as OpenAI has them: the unrun six are among `failed`.
    counts = ended.request_counts
    assert counts is not None and (counts.total, counts.completed + counts.failed) == (10, 10)
    extra = counts.model_extra or {}
    other = "expired" if ending == "cancelled" else "cancelled"
    assert (extra[ending], extra[other]) == (6, 0)
    assert ended.error_file_id is not None
    errors = [orjson.loads(x) for x in sdk.files.content(ended.error_file_id).content.splitlines()]
    assert sum(e["error"] and e["error"]["code"] == f"batch_{ending}" for e in errors) == 6
    ran_and_failed = counts.failed - 6

    main(["batches", "show", batch.id, "--base-url", server.base_url, "--api-key", ADMIN_KEY])
    shown = capsys.readouterr().out
    assert f"{counts.completed} ok, {ran_and_failed} failed, 6 {ending}, 10 total" in shown

    browser = httpx.Client(base_url=server.url, timeout=30)
    browser.post("/dashboard/login", data={"key": ADMIN_KEY, "next": "/dashboard"})
    row = browser.get("/dashboard/api/batches").json()["rows"][0]
    detail = browser.get(f"/dashboard/api/batches/{batch.id}").json()
    for shown_counts in (row, detail):
        assert (shown_counts["failed"], shown_counts[ending]) == (ran_and_failed, 6)
    page = browser.get(f"/dashboard/batches/{batch.id}").text
    assert f'data-field="{ending}">6<' in page
