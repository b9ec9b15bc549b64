"""The schedule: which shard a worker claims next, the planner's ETAs and at-risk verdicts.

The claim order is tested on the real claim statement against SQLite and PostgreSQL, with
rows built as validation and checkpoints build them; the plan on a real worker with the
scripted engine. The claim's PostgreSQL plan is checked at 100,000 shards.
"""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import openai
import orjson
import pytest
from sqlalchemy import Engine, event, select, text, update

from app.cli import main
from app.config import Settings
from app.core.progress import Progress
from app.core.schedule import Demand, Order, plan, recorded_speed
from app.core.states import BatchStatus
from app.db.models import (
    Batch,
    BatchSchedule,
    Project,
    ProjectShare,
    ResultChunk,
    Shard,
    SingletonLease,
)
from app.db.session import engine_for, session_scope, upgrade
from app.services import housekeeping, schedule, singleton_lease
from app.services.result_series import throughput_series
from app.services.steps.chunk_cleanup import delete_chunks
from app.storage import storage_of
from tests.batch_sim import admitted_batch as _batch
from tests.engine_fixtures import chat_line, jsonl, start_batch, wait_status, wait_until
from tests.fake_engine import MODEL, FakeEngine, ThreadedWorker, fast
from tests.harness import RunningServer, fresh_database, running_server
from worker import claim

LEASE = 30.0


def _claim_and_serve(
    settings: Settings,
    work: Callable[[str], int] = lambda _: 10,
    order: Order = Order.FAIR,
    model: str = MODEL,
) -> str | None:
    """Claims the next shard of `model` and checkpoints it done with `work(batch)` tokens,
    in a result chunk (the planner's measure of speed)."""
    with session_scope(settings) as session:
        lease = claim.claim_shard(session, "w", [model], LEASE, order)
    if lease is None:
        return None
    with session_scope(settings) as session:
        progress = Progress(completed=1, output_tokens=work(lease.batch_id))
        chunk = (0, f"chunk-{lease.shard_id}", 1)
        checkpointed = claim.checkpoint(session, lease, chunk=chunk, progress=progress, done=True)
        assert checkpointed is not None
    return lease.batch_id


@pytest.fixture
def db(settings: Settings) -> Settings:
    upgrade(settings.sqlalchemy_url)
    return settings


def test_fair_share_in_work_done(db: Settings) -> None:
    # Each case on its own model: a worker of one model never sees the others' batches.
    a = _batch(db, "alpha", 20)
    assert [_claim_and_serve(db) for _ in range(3)] == [a, a, a]
    b = _batch(db, "beta", 2)  # starts at alpha's clock: no head start, no backlog
    assert [_claim_and_serve(db) for _ in range(6)] == [b, a, b, a, a, a]

    def serve(model: str, n: int, work: Callable[[str], int] = lambda _: 10) -> list[str | None]:
        return [_claim_and_serve(db, work, model=model) for _ in range(n)]

    light, heavy = (
        _batch(db, "light", 40, model="w"),
        _batch(db, "heavy", 40, model="w"),
    )
    with session_scope(db) as session:
        schedule.set_weight(session, "heavy", 3.0)
    served = serve("w", 24)
    assert served.count(heavy) == 18 and served.count(light) == 6
    with session_scope(db) as session:
        shares = session.execute(
            select(Project.name, ProjectShare.work_done)
            .join(Project, Project.id == ProjectShare.project_id)
            .where(ProjectShare.model == "w")
        ).all()
    assert dict(shares) == {"light": 60, "heavy": 180}

    # Work is tokens: requests three times the size get a third of the turns.
    big, small = (
        _batch(db, "big", 10, model="t"),
        _batch(db, "small", 10, model="t"),
    )
    served = serve("t", 8, lambda batch: 30 if batch == big else 10)
    assert served.count(big) == 2 and served.count(small) == 6

    # Inside a project, batches share the same way, the older first on ties.
    first, second = (
        _batch(db, "solo", 5, model="s"),
        _batch(db, "solo", 5, model="s"),
    )
    assert serve("s", 4) == [first, second, first, second]


def test_at_risk_first_by_deadline_and_fifo_as_before(db: Settings) -> None:
    calm = _batch(db, "calm", 5)
    late, later = (
        _batch(db, "rush", 3, expires_in=3600),
        _batch(db, "rush2", 3, expires_in=7200),
    )
    with session_scope(db) as session:
        for batch_id in (later, late):
            expires_at = select(Batch.expires_at).where(Batch.id == batch_id).scalar_subquery()
            session.execute(
                update(BatchSchedule)
                .where(BatchSchedule.batch_id == batch_id)
                .values(urgent_deadline=expires_at)
            )
    assert [_claim_and_serve(db) for _ in range(7)] == [late] * 3 + [later] * 3 + [calm]

    a, b = _batch(db, "alpha", 3, model="f"), _batch(db, "beta", 1, model="f")
    served = [_claim_and_serve(db, order=Order.FIFO, model="f") for _ in range(5)]
    assert served == [a, a, a, b, None]


def test_plan_flags_what_fair_share_would_make_late() -> None:
    def demand(name: str, project: str, work: float, expires: float, seq: int) -> Demand:
        return Demand(name, project, 1.0, seq, expires, work, False, False)

    now = 1000.0
    big = demand("big", "a", 1000, now + 10_000, 1)
    tight = demand("tight", "b", 100, now + 150, 2)  # fair share: 200 s, too late
    hopeless = demand("hopeless", "c", 500, now + 120, 3)
    estimates = {e.batch_id: e for e in plan([big, tight, hopeless], Order.FAIR, 1.0, now)}
    assert estimates["tight"].at_risk and estimates["hopeless"].at_risk
    assert not estimates["big"].at_risk
    # EDF among those at risk: hopeless (deadline 120) first, tight after it, and late.
    assert estimates["hopeless"].expected_miss and estimates["tight"].expected_miss
    assert estimates["hopeless"].start_at == now
    assert estimates["big"].finish_at == pytest.approx(now + 1600)
    fair = {e.batch_id: e for e in plan([big, tight], Order.FAIR, 1.0, now)}
    assert fair["tight"].at_risk and not fair["tight"].expected_miss
    assert fair["tight"].finish_at == pytest.approx(now + 100)
    fifo = {e.batch_id: e for e in plan([big, tight], Order.FIFO, 1.0, now)}
    assert fifo["tight"].start_at == pytest.approx(now + 1000) and fifo["tight"].expected_miss


def test_recorded_speed_counts_only_work_done_inside_the_measured_time() -> None:
    # Two shards checkpointing 100 work a second each, half a second apart: 200 work/s. The
    # first chunk holds work done before its moment, so it is not divided by the time after
    # it (the old rule said 1,200 / 5.5 s = 218 here, and 300 / 1 s = 300 a second in).
    records = [(10.0 + s + shard * 0.5, 100) for s in range(6) for shard in range(2)]
    assert recorded_speed(records) == pytest.approx(200)
    assert recorded_speed([(10.0, 100), (10.5, 100), (11.0, 100)]) == pytest.approx(200)
    # One moment tells no speed yet.
    assert recorded_speed([(10.0, 100)]) == 0.0
    assert recorded_speed([(10.0, 100), (10.0, 50)]) == 0.0


def test_the_speed_counts_the_work_of_batches_that_ended_in_its_window(db: Settings) -> None:
    """A batch's result chunks go when it ends: the model's measured speed keeps its work
    from the throughput series kept on it, so the ETAs of the rest do not slow down."""
    running, ended = _batch(db, "a", 4), _batch(db, "b", 2)
    for _ in range(4):  # fair share: two shards of each, `ended` is then done
        _claim_and_serve(db)
    now = time.time()
    with session_scope(db) as session:
        # The moments its chunks were recorded: every 5 s per batch, 1 s apart.
        chunks = session.execute(
            select(ResultChunk.id, Shard.batch_id)
            .join(Shard, Shard.id == ResultChunk.shard_id)
            .order_by(Shard.batch_id, ResultChunk.id)
        ).all()
        base = {running: now - 10, ended: now - 9}
        seen: dict[str, int] = {}
        for chunk_id, batch_id in chunks:
            at = base[batch_id] + 5 * seen.setdefault(batch_id, 0)
            seen[batch_id] += 1
            session.execute(
                update(ResultChunk).where(ResultChunk.id == chunk_id).values(created_at=at)
            )
    with session_scope(db) as session:  # it ends as the finalizer ends it
        batch = session.scalars(select(Batch).where(Batch.id == ended)).one()
        assert session.get_one(BatchSchedule, ended).work_done == 20
        batch.status, batch.completed_at = BatchStatus.COMPLETED, int(now - 3)
        batch.completed = 2
        batch.throughput = throughput_series(session, ended)
    delete_chunks(db, storage_of(db), ended)
    with session_scope(db) as session:
        estimates = {e.batch_id: e for e in schedule.replan(session, Order.FAIR, now)}
    # Work 10 at -10 (where the measured time starts), -9, -5, -4: 30 in 6 s, 5 a second.
    # Without `ended`'s work it was 10 in 5 s, and the 20 left would take 10 s, not 4.
    assert estimates[running].finish_at == pytest.approx(now + 4, abs=0.01)


def test_one_planner_pass_at_a_time_and_the_lease_passes_on(db: Settings) -> None:
    """Two replicas' planners at once: one pass a tick, its rows once; the other takes over
    when the holder stops (at expiry, or at once when it released the lease)."""
    lease_seconds = 3.0
    tuned = db.model_copy(update={"lease_seconds": lease_seconds})
    batch_ids = {_batch(tuned, "alpha", 40), _batch(tuned, "beta", 40)}

    passes: list[str] = []  # the owner of each planner pass, as it reads the open batches

    def widen_the_race(_conn: object, _cursor: object, statement: str, *_args: object) -> None:
        # Between reading the open batches and writing their ETAs: two passes at once would
        # both be inside here.
        owner = threading.current_thread().name
        if owner.startswith("api-") and "batch_schedules.eta_finish_at" in statement:
            passes.append(owner)
            time.sleep(0.2)

    def estimated() -> set[str]:
        with session_scope(tuned) as session:
            estimated = BatchSchedule.eta_finish_at.is_not(None)
            return set(session.scalars(select(BatchSchedule.batch_id).where(estimated)))

    engine = engine_for(tuned.sqlalchemy_url)
    event.listen(engine, "after_cursor_execute", widen_the_race)
    holders = []
    try:
        for tick in range(3):
            for _ in range(4):  # two more requests each: every batch's estimate is recorded
                _claim_and_serve(tuned)
            start, won = threading.Barrier(2), {}

            def plan(owner: str, start: threading.Barrier = start, won: dict = won) -> None:
                start.wait()
                won[owner] = housekeeping.plan(tuned, owner)

            owners = [f"api-{i}" for i in range(2)]
            threads = [threading.Thread(target=plan, args=(o,), name=o) for o in owners]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert sorted(won.values()) == [False, True], tick
            holders.append(next(owner for owner, planned in won.items() if planned))
            assert passes == [holders[-1]], passes  # one pass, by the lease's holder
            passes.clear()
            assert estimated() == batch_ids
    finally:
        event.remove(engine, "after_cursor_execute", widen_the_race)
    assert len(set(holders)) == 1  # the turn stays with its holder
    holder = holders[0]
    other = "api-1" if holder == "api-0" else "api-0"

    # The holder stops: the other plans once the lease has lapsed, not before.
    stopped = time.monotonic()
    assert not housekeeping.plan(tuned, other)
    while not housekeeping.plan(tuned, other):
        assert time.monotonic() - stopped < 3 * lease_seconds
        time.sleep(0.1)
    assert time.monotonic() - stopped >= lease_seconds - 1.0
    assert not housekeeping.plan(tuned, holder)
    # A holder that shuts down releases it: the next taker plans at once.
    with session_scope(tuned) as session:
        singleton_lease.release(session, housekeeping.PLANNER, other)
    assert housekeeping.plan(tuned, holder)


def test_an_api_that_stops_hands_the_planner_on(settings: Settings) -> None:
    """The API's housekeeping plans under the lease and gives it up when the process stops."""
    tuned = fast(settings, lease_seconds=60.0)
    with running_server(tuned):
        deadline = time.monotonic() + 30
        while (holder := _planner_holder(tuned)) is None:
            assert time.monotonic() < deadline, "the API never took the planner's lease"
            time.sleep(0.1)
        assert holder.startswith("api:")
        assert not housekeeping.plan(tuned, "api-next")  # while it runs, it plans
    assert _planner_holder(tuned) is None
    assert housekeeping.plan(tuned, "api-next")  # at once, not a minute later


def _planner_holder(settings: Settings) -> str | None:
    with session_scope(settings) as session:
        return session.scalar(
            select(SingletonLease.owner).where(SingletonLease.name == housekeeping.PLANNER)
        )


# -- through the API, with a real worker (scripted engine) --

ADMIN = "sk-admin-schedule-test"


@pytest.fixture
def server(settings: Settings) -> Iterator[RunningServer]:
    tuned = fast(settings, admin_key=ADMIN, shard_lines=10, housekeeping_interval_seconds=0.2)
    with running_server(tuned) as running:
        yield running


def _sdk(server: RunningServer, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key=key, max_retries=0)


def test_small_later_batch_of_another_project_finishes_first_with_estimates(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    admin = _sdk(server, ADMIN)
    keys = {
        name: admin.post("/admin/api_keys", body={"project": name}, cast_to=dict)["value"]
        for name in ("alpha", "beta")
    }
    alpha, beta = _sdk(server, keys["alpha"]), _sdk(server, keys["beta"])
    cli = ["--base-url", server.base_url, "--api-key", ADMIN]
    assert main(["projects", "weight", "beta", "2", *cli]) == 0
    assert main(["projects", "list", "--json", *cli]) == 0
    listed = {
        p["name"]: p["weight"] for p in orjson.loads(capsys.readouterr().out.split("\n", 1)[1])
    }
    assert listed == {"alpha": 1.0, "beta": 2.0, "default": 1.0}

    engine = FakeEngine(delay=0.15, max_num_seqs=4)  # ~6 s: the planner makes several estimates
    with ThreadedWorker(server.settings, engine, max_active_shards=2):
        big = start_batch(alpha, jsonl([chat_line(f"a{i}") for i in range(300)]))
        with estimates_shown(_sdk(server, keys["alpha"]), big) as seen:
            wait_until(
                alpha,
                big,
                lambda b: b.request_counts is not None and b.request_counts.completed >= 20,
            )
            small = start_batch(beta, jsonl([chat_line(f"b{i}") for i in range(10)]))
            planned = wait_until(
                alpha,
                big,
                lambda _: (
                    alpha.get(f"/batches/{big}/schedule", cast_to=dict)["estimated_finish_at"]
                    is not None
                ),
                timeout=30,
            )
            assert planned.status == "in_progress"
            as_alpha = ["--base-url", server.base_url, "--api-key", keys["alpha"]]
            assert main(["batches", "show", big, *as_alpha]) == 0
            shown = capsys.readouterr().out
            assert "estimated finish" in shown and "estimated start" in shown
            done_small = wait_status(beta, small, "completed")
            at_small_end = alpha.batches.retrieve(big)
            assert at_small_end.status == "in_progress"
            assert at_small_end.request_counts is not None
            assert at_small_end.request_counts.completed < 200
            done_big = wait_status(alpha, big, "completed", timeout=120)
    assert done_small.completed_at is not None and done_big.completed_at is not None
    assert done_small.completed_at <= done_big.completed_at
    with pytest.raises(openai.NotFoundError):  # another project's batch
        beta.get(f"/batches/{big}/schedule", cast_to=dict)
    ended = alpha.get(f"/batches/{big}/schedule", cast_to=dict)
    assert ended["estimated_finish_at"] is None and ended["position"] is None
    recorded = [done for _, done in seen]
    assert len(recorded) >= 3 and list(recorded) == sorted(recorded)


@contextmanager
def estimates_shown(client: openai.OpenAI, batch_id: str) -> Iterator[list[tuple[float, int]]]:
    """Each new estimate the batch's schedule shows meanwhile: (made at, requests done)."""
    seen: list[tuple[float, int]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.05):
            made = client.get(f"/batches/{batch_id}/schedule", cast_to=dict)["estimated_at"]
            if made is not None and (not seen or made != seen[-1][0]):
                counts = client.batches.retrieve(batch_id).request_counts
                seen.append((made, counts.completed if counts else 0))

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join(10)


# -- the claim's plan on PostgreSQL --


def fill_queue(engine: Engine, batches: int, shards_per_batch: int, finished: int) -> None:
    """`batches` running batches of pending shards from 5 projects, after `finished` done ones;
    every third shard names a LoRA adapter."""
    now = int(time.time())
    total = batches + finished
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO projects (id, name, created_at, weight) "
                "SELECT 'proj_' || p, 'p' || p, :now, 1 FROM generate_series(1, 5) p"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO files (id, project_id, filename, purpose, bytes, sha256, "
                "storage_key, status, created_at) VALUES "
                "('file-x', 'proj_1', 'in.jsonl', 'batch', 0, '', 'k', 'processed', :now)"
            ),
            {"now": now},
        )
        conn.execute(
            text(
                "INSERT INTO batches (id, project_id, endpoint, input_file_id, model, "
                "completion_window, status, created_at, expires_at, total, completed, failed, "
                "input_tokens, cached_tokens, output_tokens, reasoning_tokens, lease_epoch, "
                "cancelled, expired) "
                "SELECT 'batch_' || b, 'proj_' || (b % 5 + 1), '/v1/chat/completions', "
                "'file-x', :model, '24h', CASE WHEN b <= :finished THEN 'completed' "
                "ELSE 'in_progress' END, :now, :now + 86400, 1000000, "
                "0, 0, 0, 0, 0, 0, 0, 0, 0 FROM generate_series(1, :total) b"
            ),
            {"now": now, "model": MODEL, "finished": finished, "total": total},
        )
        conn.execute(
            text(
                "INSERT INTO batch_schedules (batch_id, work_done, vtime, expected_miss) "
                "SELECT 'batch_' || b, 0, b, false FROM generate_series(1, :total) b"
            ),
            {"total": total},
        )
        conn.execute(
            text(
                "INSERT INTO project_shares (project_id, model, vtime, work_done) "
                "SELECT 'proj_' || p, :model, p, 0 FROM generate_series(1, 5) p"
            ),
            {"model": MODEL},
        )
        conn.execute(
            text(
                "INSERT INTO shards (batch_id, index, first_line, line_count, byte_start, "
                "byte_end, status, lease_epoch, attempts, completed, failed, input_tokens, "
                "cached_tokens, output_tokens, reasoning_tokens) "
                "SELECT 'batch_' || (s / :per + 1 + :finished), s % :per, s % :per * 1000 + 1, "
                "1000, 0, 0, 'pending', 0, 0, 0, 0, 0, 0, 0, 0 "
                "FROM generate_series(0, :shards - 1) s"
            ),
            {"per": shards_per_batch, "finished": finished, "shards": batches * shards_per_batch},
        )
        # A LoRA adapter named by every third shard (what a LoRA worker's claim reads).
        conn.execute(text("INSERT INTO shard_adapters SELECT id, 'b' FROM shards WHERE id % 3 = 0"))
        conn.execute(text("ANALYZE"))


@pytest.fixture(scope="module")
def big_queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    """100,000 pending shards: 400 running batches of 250, after 20,000 finished batches."""
    with fresh_database("postgresql", tmp_path_factory.mktemp("queue")) as url:
        upgrade(url)
        engine = engine_for(url)
        fill_queue(engine, batches=400, shards_per_batch=250, finished=20_000)
        yield engine
        engine.dispose()


@pytest.mark.parametrize("lora", [False, True], ids=["plain", "lora"])
@pytest.mark.parametrize("order", list(Order))
def test_claim_plan_is_an_index_scan_at_100000_shards(
    big_queue: Engine, order: Order, lora: bool
) -> None:
    # With LoRA the claim also orders the top batches' shards by their adapters.
    statement = claim.claim_statement(order, lora)
    params = claim.claim_params("w", [MODEL], LEASE, {"a"} if lora else None)
    with big_queue.connect() as conn:
        expanded = statement.compile(conn).construct_expanded_state(params)
        rows = conn.exec_driver_sql("EXPLAIN " + expanded.statement, expanded.parameters).all()
        plan_text = "\n".join(r[0] for r in rows)
        conn.rollback()
        started = time.perf_counter()
        with conn.begin():
            assert conn.execute(statement, params).first() is not None
        took = time.perf_counter() - started
    scans = [line for line in plan_text.splitlines() if "Scan" in line]
    assert any("Index Scan using ix_shards_claim" in line for line in scans), plan_text
    assert any("ix_batches_running" in line for line in scans), plan_text
    assert not lora or any("using pk_shard_adapters" in line for line in scans), plan_text
    assert not [
        line
        for line in scans
        if "Seq Scan on shard" in line
        or "Seq Scan on batch_schedules" in line
        or ("on batches" in line and "Seq Scan" in line)
    ], plan_text
    print(f"claim at 100,000 shards ({order}, lora {lora}): {took * 1000:.1f} ms")
