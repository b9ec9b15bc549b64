"""The deployment's figures are read once for everyone asking at the same moment, and never
wait for a writer: `/metrics`, the dashboard's overview and `GET /v1/admin/stats` share them."""

import sqlite3
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import event

from app.cli import main
from app.config import Settings
from app.db.session import engine_for
from app.services.stats import StatsReader
from tests import batch_sim
from tests.harness import RunningServer

TOTALS_QUERY = "GROUP BY batches.api, batches.status"


def test_callers_at_the_same_moment_share_one_read(settings: Settings) -> None:
    reads: list[float] = []

    def slow_totals(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if TOTALS_QUERY in statement:
            reads.append(time.monotonic())
            time.sleep(1.0)  # a read long enough for every caller to arrive during it

    engine = engine_for(settings.sqlalchemy_url)
    event.listen(engine, "before_cursor_execute", slow_totals)
    try:
        reader = StatsReader(settings)
        callers = 8
        start = threading.Barrier(callers)
        got: list[float] = []

        def ask() -> None:
            start.wait()
            got.append(reader.get().taken_at)

        threads = [threading.Thread(target=ask) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(got) == callers
        assert len(reads) == 1, f"{len(reads)} reads for {callers} callers at once"
        assert len(set(got)) == 1  # the same figures for all
        # A caller that comes after the read has ended reads afresh.
        assert reader.get().taken_at > got[0] and len(reads) == 2
    finally:
        event.remove(engine, "before_cursor_execute", slow_totals)


@pytest.mark.backends("sqlite")
def test_a_scrape_does_not_wait_for_a_writer(settings: Settings, server: RunningServer) -> None:
    path = settings.sqlalchemy_url.removeprefix("sqlite:///")
    writer = sqlite3.connect(path, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")  # holds SQLite's write lock, as a long commit would
    try:
        # A read that took the write lock would wait for it (busy_timeout: 30 s).
        scraped = httpx.get(f"{server.url}/metrics", timeout=15)
        assert scraped.status_code == 200 and "overnight_batches" in scraped.text
    finally:
        writer.execute("ROLLBACK")
        writer.close()


def test_status_the_api_and_metrics_show_the_same_figures(
    settings: Settings, server: RunningServer, client: openai.OpenAI, capsys: pytest.CaptureFixture
) -> None:
    upload = client.files.create(file=("in.jsonl", batch_sim.requests_file(7)), purpose="batch")
    batch = client.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    deadline = time.monotonic() + 60
    while client.batches.retrieve(batch.id).status != "in_progress":
        assert time.monotonic() < deadline, "the batch was never validated"
        time.sleep(0.05)

    stats = client.get("/admin/stats", cast_to=httpx.Response).json()
    assert stats["object"] == "stats" and stats["batches"] == {"in_progress": 1}
    [model] = [m for m in stats["models"] if m["model"] == batch_sim.MODEL]
    assert (model["queued_requests"], model["running_batches"]) == (7, 1)
    assert stats["workers"] == {} and model["workers"] == {}

    families = text_string_to_metric_families(httpx.get(f"{server.url}/metrics").text)
    scraped: dict[tuple[str, str | None], float] = {}
    for sample in (s for f in families for s in f.samples):
        # Summed over the labels left out (`overnight_batches` has a series per `api`).
        key = (sample.name, sample.labels.get("status") or sample.labels.get("model"))
        scraped[key] = scraped.get(key, 0) + sample.value
    assert scraped[("overnight_batches", "in_progress")] == 1
    assert scraped[("overnight_queue_requests", batch_sim.MODEL)] == 7

    main(["status", "--base-url", server.base_url])
    shown = capsys.readouterr().out
    assert "batches: 1 in_progress" in shown and "workers: none" in shown
    assert any(line.split()[:3] == [batch_sim.MODEL, "7", "1"] for line in shown.splitlines()), (
        shown
    )
