"""The dashboard's view data straight from the services, on SQLite and PostgreSQL (no server)."""

import argparse
import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.states import BatchApi, BatchStatus, ShardStatus
from app.dashboard import charts, content, display, project_views
from app.db.models import Batch, RegisteredWorker, ResultChunk, Shard
from app.db.session import session_scope, upgrade
from app.ids import new_batch_id
from app.schemas.admin import WorkerState
from app.services import monitoring
from app.services.auth import ensure_project
from app.services.batch_search import find_custom_id
from app.services.files import preview_file
from app.services.fleet import day_start
from app.services.stats import read_stats
from app.storage import Storage, storage_for
from tests import batch_sim
from worker import cli as worker_cli
from worker import engine, registry

NOW = time.time()
DAY = 86400


@pytest.fixture
def db(settings: Settings) -> Iterator[Settings]:
    upgrade(settings.sqlalchemy_url)
    yield settings


@pytest.fixture
def storage(db: Settings) -> Storage:
    return storage_for(str(db.storage_dir))


def add_batch(
    settings: Settings,
    *,
    project: str = "default",
    status: BatchStatus = BatchStatus.COMPLETED,
    lines: bytes | None = None,
    created_at: float = NOW - 600,
    **columns: Any,
) -> str:
    """A batch row as the lifecycle leaves it, with a real input file in storage."""
    with session_scope(settings) as session:
        project_id = ensure_project(session, project).id
    file_id = batch_sim.store_input_file(
        settings, lines or batch_sim.requests_file(3), project_id=project_id
    )
    batch_id = new_batch_id()
    ran = status not in (BatchStatus.VALIDATING, BatchStatus.FAILED)
    with session_scope(settings) as session:
        session.add(
            Batch(
                id=batch_id,
                project_id=project_id,
                endpoint="/v1/chat/completions",
                input_file_id=file_id,
                model=batch_sim.MODEL,
                completion_window="24h",
                status=status,
                created_at=int(created_at),
                expires_at=int(created_at) + DAY,
                in_progress_at=int(created_at) + 5 if ran else None,
                **columns,
            )
        )
    return batch_id


def rows(session: Session, storage: Storage, **query: Any) -> dict[str, Any]:
    return content.batch_rows(session, storage, content.BatchQuery(**query))


def test_search_dates_and_cursor_pages(db: Settings, storage: Storage) -> None:
    old = add_batch(db, created_at=NOW - 3 * DAY, metadata_={"team": "café 100%"})
    quoted = add_batch(db, project="other", metadata_={"note": 'say "hi"'})
    plain = add_batch(db, metadata_={"team": "search"})
    with session_scope(db) as session:
        ids = lambda **q: [r["id"] for r in rows(session, storage, **q)["rows"]]  # noqa: E731
        assert ids() == [plain, quoted, old]
        assert ids(q=quoted) == [quoted]  # a batch id, exactly
        assert ids(q="CAFé 100%") == [old]  # a metadata value, ASCII in any case
        assert ids(q="100%") == [old] and ids(q="10_%") == []  # LIKE's wildcards are literal
        assert ids(q='"hi"') == [quoted]  # a quote inside a value
        assert ids(q="nothing-like-it") == []
        today = time.strftime("%Y-%m-%d", time.gmtime(NOW - 600))
        three_ago = time.strftime("%Y-%m-%d", time.gmtime(NOW - 3 * DAY))
        assert ids(date_from=today) == [plain, quoted]
        assert ids(date_to=three_ago) == [old]
        assert ids(date_from=three_ago, date_to=three_ago, q="search") == []
        # One a page, from the cursor on, as the API's `after`: each batch once, in order.
        seen, page = [], rows(session, storage, limit=1)
        while True:
            seen += [r["id"] for r in page["rows"]]
            if not page["next_href"]:
                break
            after = page["next_href"].split("after=")[1].split("&")[0]
            assert "limit=1" in page["next_href"]
            page = rows(session, storage, limit=1, after=after)
        assert seen == [plain, quoted, old]
        with pytest.raises(Exception, match="YYYY-MM-DD"):
            rows(session, storage, date_from="yesterday")


def test_custom_id_search_streams_input_files_within_a_budget(
    db: Settings, storage: Storage
) -> None:
    odd_id = 'line "7" / ünï'
    lines = [batch_sim.request_line(f"a-{i}") for i in range(50)] + [batch_sim.request_line(odd_id)]
    first = add_batch(db, lines=batch_sim.jsonl(lines), created_at=NOW - 900)
    second = add_batch(db, lines=batch_sim.requests_file(50, prefix="a"), created_at=NOW - 800)
    never_ran = add_batch(
        db, status=BatchStatus.FAILED, lines=batch_sim.requests_file(3, prefix="a")
    )
    with session_scope(db) as session:
        where = monitoring.BatchFilter()
        found = find_custom_id(session, storage, where, "a-7")
        assert [v.batch.id for v in found.views] == [second, first]
        assert never_ran not in [v.batch.id for v in found.views]  # it failed validation
        assert found.next_after is None
        assert [v.batch.id for v in find_custom_id(session, storage, where, odd_id).views] == [
            first
        ]
        assert find_custom_id(session, storage, where, "a-7 ").views == []  # exact, not a prefix
        # A budget smaller than both files: one file is read, and the cursor goes on from it.
        size = monitoring.files_by_id(session, [v.batch.input_file_id for v in found.views])
        budget = max(f.bytes for f in size.values()) + 1
        capped = find_custom_id(session, storage, where, "a-7", budget=budget)
        assert [v.batch.id for v in capped.views] == [second] and capped.next_after == second
        rest = monitoring.BatchFilter(after=capped.next_after)
        assert [v.batch.id for v in find_custom_id(session, storage, rest, "a-7").views] == [first]
        page = rows(session, storage, custom_id="a-7")
        assert [r["id"] for r in page["rows"]] == [second, first]
        assert "Searched" in page["search_note"] and page["next_href"] == ""


def test_rows_show_reason_duration_and_stacked_counts(db: Settings, storage: Storage) -> None:
    error = {"code": "invalid_json_line", "message": "This line is not JSON.", "line": 2}
    failed = add_batch(
        db, status=BatchStatus.FAILED, errors=[error, {**error, "line": 5}], failed_at=int(NOW)
    )
    cancelled = add_batch(
        db,
        status=BatchStatus.CANCELLED,
        total=10,
        completed=4,
        failed=6,
        cancelled=5,
        cancelled_at=int(NOW - 600 + 125),
        output_tokens=400,
    )
    expired = add_batch(db, status=BatchStatus.EXPIRED, total=2, failed=2, expired=2)
    with session_scope(db) as session:
        found = {r["id"]: r for r in rows(session, storage)["rows"]}
    assert found[failed]["reason"] == "line 2: This line is not JSON. (+1 more)"
    assert "24h completion window ended" in found[expired]["reason"]
    row = found[cancelled]
    assert row["reason"] == "" and row["duration"] == "2m 05s" and row["eta"] == display.DASH
    assert row["throughput"] == "3.3 tok/s"  # 400 output tokens over 120 s of running
    assert (row["completed"], row["failed"], row["cancelled"]) == (4, 1, 5)
    assert [(s["kind"], s["x"], s["width"]) for s in row["segments"]] == [
        ("completed", 0.0, 40.0),
        ("failed", 40.0, 10.0),
        ("unrun", 50.0, 50.0),
    ]


def test_rows_say_which_api_a_batch_came_through(db: Settings, storage: Storage) -> None:
    openai_batch = add_batch(db)
    message_batch = add_batch(db, api=BatchApi.ANTHROPIC)
    with session_scope(db) as session:
        found = {r["id"]: r for r in rows(session, storage)["rows"]}
    assert (found[openai_batch]["api"], found[openai_batch]["message_batch"]) == (
        "OpenAI Batch API",
        False,
    )
    assert (found[message_batch]["api"], found[message_batch]["message_batch"]) == (
        "Anthropic Message Batches",
        True,
    )


def test_overview_queue_workers_tokens_and_series(db: Settings, storage: Storage) -> None:
    today = day_start(NOW)
    add_batch(db, project="ml", completed_at=int(NOW), input_tokens=100, output_tokens=50)
    add_batch(db, project="ml", completed_at=today - 10, output_tokens=999)  # yesterday
    ended_at = NOW - 120
    add_batch(
        db,
        project="ops",
        completed_at=int(ended_at),
        output_tokens=7,
        throughput=[[ended_at - 60, 2.0], [ended_at - 30, 4.0]],  # 60 + 120 requests
    )
    running = add_batch(db, project="ops", status=BatchStatus.IN_PROGRESS)
    add_batch(db, status=BatchStatus.VALIDATING)
    with session_scope(db) as session:
        shard = Shard(
            batch_id=running,
            index=0,
            first_line=1,
            line_count=10,
            byte_start=0,
            byte_end=100,
            status=ShardStatus.RUNNING,
            completed=3,
            output_tokens=30,
        )
        session.add(shard)
        session.flush()
        session.add(
            ResultChunk(
                shard_id=shard.id, epoch=1, sequence=0, storage_key="k", lines=3, created_at=NOW - 5
            )
        )
        now = time.time()
        for worker_id, ready, beat, stopped in (
            ("w-up", now - 100, now, None),
            ("w-loading", None, now, None),
            ("w-stale", now - 900, now - 600, None),
            ("w-gone", now - 900, now - 600, now - 560),
        ):
            session.add(
                RegisteredWorker(
                    id=worker_id,
                    host="h",
                    pid=1,
                    model=batch_sim.MODEL,
                    started_at=now - 1000,
                    heartbeat_at=beat,
                    tokens_per_second=12.5,
                    stopped_at=stopped,
                    ready_at=ready,
                )
            )
    with session_scope(db) as session:
        found = content.overview(session, read_stats(session, lease_seconds=60))
        workers = {r["id"]: r for r in content.worker_rows(session, 60)}
    assert (found["workers_up"], found["workers_loading"], found["workers_stale"]) == (1, 1, 1)
    assert found["tokens_per_second"] == "12.5 tok/s"  # the one serving
    assert found["queued_requests"] == 7
    [model] = found["models"]
    assert (model["model"], model["queued"], model["running_batches"]) == (batch_sim.MODEL, 7, 1)
    assert model["validating_batches"] == 1 and model["workers"] == "1 loading, 1 idle, 1 stale"
    assert [(p["project"], p["batches"], p["total_tokens"]) for p in found["projects"]] == [
        ("ml", 1, "150"),
        ("ops", 2, "37"),
    ]
    series = found["series"]
    assert len(series) == 60 and NOW - 3600 <= series[0][0] <= time.time() - 3600
    assert sum(rate for _t, rate in series) * 60 == pytest.approx(60 + 120 + 3)
    assert found["y_max"] >= max(rate for _t, rate in series) and found["x_end"]
    # A stopped worker says so; a loading one is listed as loading.
    assert workers["w-gone"]["state"] == WorkerState.STOPPED
    assert (
        workers["w-gone"]["uptime"].startswith("stopped ") and "ago" in workers["w-gone"]["uptime"]
    )
    assert workers["w-loading"]["state"] == WorkerState.LOADING
    assert workers["w-loading"]["uptime"].startswith("loading ")
    assert workers["w-up"]["uptime"].startswith("1m ")  # since its engine was up


def test_preview_reads_a_bounded_prefix(db: Settings, storage: Storage) -> None:
    small = batch_sim.store_input_file(db, batch_sim.requests_file(3))
    big = batch_sim.store_input_file(db, batch_sim.requests_file(5000))
    with session_scope(db) as session:
        project = ensure_project(session, "default").id
        whole = preview_file(session, storage, project, small)
        assert whole.complete and [n for n, _ in whole.lines] == [1, 2, 3]
        assert '"req-2"' in whole.lines[2][1]
        first = preview_file(session, storage, project, big, max_lines=20, max_bytes=1000)
        assert not first.complete and len(first.lines) < 20  # the byte budget ended first
        assert sum(len(text) for _n, text in first.lines) <= 1000
        shown = project_views.preview(preview_file(session, storage, project, big))
        assert len(shown["lines"]) == 20 and "first 20 lines of" in shown["caption"]


def test_a_worker_is_listed_while_its_engine_loads(db: Settings) -> None:
    def state(worker_id: str) -> WorkerState:
        with session_scope(db) as session:
            found = {v.worker.id: v.state for v in monitoring.list_workers(session, 60)}
        return found[worker_id]

    with registry.LoadingBeat(db, "w-1", batch_sim.MODEL, every=0.05) as beat:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert state("w-1") == WorkerState.LOADING
                break
            except KeyError:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        beat.ready()
        with session_scope(db) as session:
            registry.register(session, "w-1", batch_sim.MODEL)
    assert state("w-1") == WorkerState.IDLE
    with pytest.raises(RuntimeError), registry.LoadingBeat(db, "w-2", batch_sim.MODEL, every=0.05):
        time.sleep(0.2)
        raise RuntimeError("the engine did not start")
    assert state("w-2") == WorkerState.STOPPED


def test_worker_serve_is_listed_while_its_engine_loads(
    db: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`overnight worker`'s own start-up path, with an engine that loads and then fails."""
    seen: list[WorkerState] = []

    @asynccontextmanager
    async def loading_engine(_args: argparse.Namespace, online: bool) -> AsyncIterator[None]:
        deadline = time.monotonic() + 10
        while not seen:
            with session_scope(db) as session:
                seen.extend(v.state for v in monitoring.list_workers(session, 60))
            assert time.monotonic() < deadline, "the loading worker was never listed"
            await asyncio.sleep(0.05)
        raise RuntimeError("the engine did not start")
        yield

    monkeypatch.setattr(engine, "start_engine", loading_engine)
    args = argparse.Namespace(
        worker_id="w-cli",
        health_file=None,
        served_model_name=["chat"],
        model="/models/chat",
        online_port=None,
    )
    with pytest.raises(RuntimeError, match="did not start"):
        asyncio.run(worker_cli.serve(args, db))
    assert seen == [WorkerState.LOADING]
    with session_scope(db) as session:
        [gone] = monitoring.list_workers(session, 60)
    assert (gone.worker.model, gone.state) == ("chat", WorkerState.STOPPED)


def test_chart_axes_are_round_numbers() -> None:
    assert [charts.nice_ceiling(v) for v in (0, 0.3, 1, 1.2, 2.2, 3, 7, 12, 260)] == [
        1.0,
        0.5,
        1.0,
        2.0,
        2.5,
        5.0,
        10.0,
        20.0,
        500.0,
    ]
    axes = charts.chart_axes([(0.0, 3.0), (120.0, 1.0)])
    assert (axes["y_top"], axes["y_mid"]) == ("5", "2.5")
    # Two bars of 120 s each: the axis runs to the second one's end.
    assert (axes["x_start"], axes["x_mid"], axes["x_end"]) == ("00:00:00", "00:02:00", "00:04:00")
