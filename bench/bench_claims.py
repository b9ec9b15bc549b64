"""Claims that scale: 1, 2, 4, 8 and 16 worker processes on PostgreSQL, scripted engine.

Two loads, each on a fresh database: one 20,000-request batch, and 50 batches of mixed sizes
(20,000 requests in all) from 5 projects. Per worker count it prints requests/s and the
speed-up over one worker, the share of the workers' time spent claiming, checkpointing and
finalizing, claim latency p50/p99 (of every claim, and after the start: each worker's first
`START_CLAIMS` left out, shown apart as their maximum; and the claim's transaction alone,
timed inside its thread, with its CPU), and the checks: no shard claimed
twice, every request answered once, no deadlock (PostgreSQL's own counter) and no error in
any worker's log. Targets: >= 12x one worker at 16, claim p99 < 50 ms at 16.

How the load meets the fleet (`--arrival`):
  idle      (the default, a deployment's case) every worker already runs, registered and
            polling for work as an idle worker does, when the load goes in_progress; the
            clock starts then, and claims count from the validation's start;
  together  every worker waits at a gate and starts its `Worker` (registration, then the
            first claims) in the same instant: 16 processes' start on two cores at once, a
            burst a fleet started over time never makes.

The workers are real processes running the real worker (`worker.loop.Worker`: claim, reader,
scheduler, writer, checkpoints, finalizer, registry heartbeat) on a real data directory and
PostgreSQL; only the engine is scripted (`tests.fake_engine.FakeEngine`). Its time is a
sleep, not CPU, so that on a 2-core machine 16 workers are not 16 engines fighting for two
cores: what is measured is the database path. Each worker keeps `2 * max_num_seqs` requests
in flight, each answered after `--delay` seconds.

    .venv/bin/python bench/bench_claims.py [--workers 1,2,4,8,16] [--arrival idle|together]
"""

import argparse
import asyncio
import json
import logging
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import quantiles
from typing import Any

import psycopg
from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import Settings
from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus
from app.db.models import Batch, Shard
from app.db.session import session_scope, upgrade
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import ensure_project
from app.services.steps.validation import validate_pending
from tests.batch_sim import jsonl, request_line, store_input_file
from tests.harness import POSTGRES_ADMIN_URL, fresh_database

ROOT = Path(__file__).resolve().parent.parent
# What a worker's log may not contain: an exception, a deadlock, a serialization failure.
_LOG_PROBLEMS = re.compile(r"Traceback|deadlock|could not serialize|ERROR", re.IGNORECASE)


# A worker claims a shard, then the next one as soon as that one is fed (`worker/loop.py`):
# with `--arrival together` these two claims of every worker meet in one burst.
START_CLAIMS = 2


# -- the worker process (`bench_claims.py --worker …`) --


@dataclass
class WorkerStats:
    started: float = 0.0
    ended: float = 0.0
    cpu_seconds: float = 0.0  # the process's CPU time (every thread) from the gate on
    claims: list[tuple[float, bool]] | None = None  # (seconds, got a shard), from the gate on
    # (seconds, CPU seconds) of each counted claim's transaction, timed inside its thread
    claim_threads: list[tuple[float, float]] | None = None
    held: list[tuple[int, int]] | None = None  # (shard id, epoch) of every claim
    checkpoints: list[float] | None = None
    finalizing: list[float] | None = None


def _instrument(stats: WorkerStats, counting: asyncio.Event) -> None:
    """Times the claim, the checkpoint and the finalizer as the worker's event loop sees them,
    and the claim's transaction inside its thread too (what the database path takes, without
    the waits for the worker's own event loop); a claim counts once `counting` is set (an idle
    fleet's empty polls before the load do not)."""
    from worker.loop import Worker
    from worker.shard import ShardRun

    stats.claims, stats.held, stats.checkpoints, stats.finalizing = [], [], [], []
    stats.claim_threads = []
    claim, checkpoint, finalize = Worker._claim, ShardRun._checkpoint, Worker._finalize_now
    take = Worker._take_shard

    def timed_take(self: Worker, *args: Any) -> Any:
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return take(self, *args)
        finally:
            if counting.is_set():
                spent = (time.perf_counter() - start, time.thread_time() - cpu)
                stats.claim_threads.append(spent)  # type: ignore[union-attr]

    async def timed_claim(self: Worker) -> bool:
        start = time.perf_counter()
        got = await claim(self)
        if counting.is_set():
            stats.claims.append((time.perf_counter() - start, got))  # type: ignore[union-attr]
        if got:
            lease = list(self.active.values())[-1].lease
            stats.held.append((lease.shard_id, lease.epoch))  # type: ignore[union-attr]
        return got

    async def timed_checkpoint(self: ShardRun, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return await checkpoint(self, *args, **kwargs)
        finally:
            stats.checkpoints.append(time.perf_counter() - start)  # type: ignore[union-attr]

    async def timed_finalize(self: Worker) -> None:
        start = time.perf_counter()
        await finalize(self)
        stats.finalizing.append(time.perf_counter() - start)  # type: ignore[union-attr]

    Worker._claim = timed_claim  # type: ignore[method-assign]
    Worker._take_shard = timed_take  # type: ignore[method-assign]
    ShardRun._checkpoint = timed_checkpoint  # type: ignore[method-assign]
    Worker._finalize_now = timed_finalize  # type: ignore[method-assign]


async def _worker_main(args: argparse.Namespace) -> int:
    from app.config import get_settings
    from tests.fake_engine import FakeEngine
    from worker.health import HealthState
    from worker.loop import Worker, WorkerOptions, install_signal_handlers

    settings = get_settings()
    upgrade(settings.sqlalchemy_url)
    stats, counting = WorkerStats(), asyncio.Event()
    _instrument(stats, counting)
    stop = asyncio.Event()
    install_signal_handlers(stop)
    engine = FakeEngine(delay=args.delay, max_num_seqs=args.max_num_seqs)
    worker = Worker(settings, engine, WorkerOptions(worker_id=args.worker_id))
    ready = Path(args.stats).with_suffix(".ready")
    gate, cpu = Path(args.gate), 0.0

    async def start_counting() -> None:
        nonlocal cpu
        while not gate.exists() and not stop.is_set():
            await asyncio.sleep(0.005)
        stats.started, cpu = time.time(), time.process_time()
        counting.set()

    if args.arrival == "together":
        ready.touch()
        await start_counting()
        code = await worker.run(stop)
    else:
        # Registered and polling before the load exists: `.ready` after one poll interval.
        counter = asyncio.create_task(start_counting())
        running = asyncio.create_task(worker.run(stop))
        while worker.health.state is not HealthState.READY and not running.done():
            await asyncio.sleep(0.005)
        await asyncio.sleep(settings.worker_poll_seconds)
        ready.touch()
        code = await running
        counter.cancel()
    stats.ended, stats.cpu_seconds = time.time(), time.process_time() - cpu
    Path(args.stats).write_text(json.dumps(stats.__dict__))
    return code


# -- the loads --


def mixed_sizes(total: int, batches: int, seed: int = 14) -> list[int]:
    """`batches` sizes summing to `total`, spread over two orders of magnitude."""
    rng = random.Random(seed)
    weights = [rng.lognormvariate(0, 1.2) for _ in range(batches)]
    sizes = [max(1, int(total * w / sum(weights))) for w in weights]
    sizes[sizes.index(max(sizes))] += total - sum(sizes)
    return sizes


def load(settings: Settings, kind: str, requests: int) -> list[str]:
    """Creates the load's batches (validation follows); returns their ids."""
    plan = [("bench", requests)] if kind == "one" else []
    if kind == "mixed":
        plan = [(f"project-{i % 5}", n) for i, n in enumerate(mixed_sizes(requests, 50))]
    ids = []
    for b, (project, n) in enumerate(plan):
        with session_scope(settings) as session:
            project_id = ensure_project(session, project).id
        data = jsonl(request_line(f"b{b}-{i}") for i in range(n))
        file_id = store_input_file(settings, data, project_id)
        with session_scope(settings) as session:
            params = CreateBatchRequest(
                input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            ids.append(batches.create_batch(session, settings, project_id, params).id)
    return ids


@dataclass
class Run:
    workers: int
    requests: int
    seconds: float  # gate → every batch terminal
    run_seconds: float  # gate → the last shard done
    claim_share: float
    checkpoint_share: float
    finalize_share: float
    claim_p50_ms: float
    claim_p99_ms: float
    running_claim_p99_ms: float  # each worker's START_CLAIMS left out
    start_claim_max_ms: float
    claim_thread_p99_ms: float  # the claim's transaction, timed in its thread
    claim_cpu_p50_ms: float
    checkpoint_p99_ms: float
    claims: int
    twice: int
    unanswered: int
    deadlocks: int
    log_problems: int
    peak_connections: int
    cpu_ms_per_request: float


def _p(values: list[float], q: int) -> float:
    if len(values) < 2:
        return 1000 * (values[0] if values else 0.0)
    return 1000 * quantiles(values, n=100, method="inclusive")[q - 1]


def _deadlocks(name: str) -> int:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute(
            "SELECT deadlocks FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
    return int(row[0]) if row else 0


def _connections(name: str) -> int:
    with psycopg.connect(POSTGRES_ADMIN_URL, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,))
        return int(row.fetchone()[0])  # type: ignore[index]


def run(args: argparse.Namespace, kind: str, workers: int, base: Path) -> Run:
    folder = Path(tempfile.mkdtemp(prefix=f"{kind}-{workers}-", dir=base))
    with fresh_database("postgresql", folder) as url:
        db_name = url.rsplit("/", 1)[1]
        settings = Settings(data_dir=folder, database_url=url, shard_lines=args.shard_lines)
        upgrade(url)
        ids = load(settings, kind, args.requests)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "OVERNIGHT_DATABASE_URL": url,
            "OVERNIGHT_DATA_DIR": str(folder),
            "OVERNIGHT_SHARD_LINES": str(args.shard_lines),
            "OVERNIGHT_LOG_FORMAT": "text",
        }
        gate = folder / "gate"
        procs = []
        for i in range(workers):
            log = open(folder / f"worker-{i}.log", "wb")  # noqa: SIM115
            cmd = [sys.executable, __file__, "--worker", f"--worker-id=bench-{i}"]
            cmd += [f"--gate={gate}", f"--stats={folder / f'worker-{i}.json'}"]
            cmd += [f"--delay={args.delay}", f"--max-num-seqs={args.max_num_seqs}"]
            cmd += [f"--arrival={args.arrival}"]
            cmd += ["--profile"] if args.profile else []
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT))
        while not all((folder / f"worker-{i}.ready").exists() for i in range(workers)):
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a worker died at start; see {folder}")
            time.sleep(0.05)
        deadlocks = _deadlocks(db_name)
        if args.arrival == "idle":
            gate.touch()  # claims count from here: the idle fleet's polls meet the load
        validate_pending(settings, "bench-validator")  # the load goes in_progress on return
        if args.arrival == "together":
            gate.touch()
        started = time.time()
        peak = 0
        try:
            while True:
                with session_scope(settings) as session:
                    open_ = session.scalar(
                        select(func.count())
                        .select_from(Batch)
                        .where(Batch.id.in_(ids), Batch.status.not_in(TERMINAL_BATCH_STATUSES))
                    )
                if open_ == 0:
                    break
                peak = max(peak, _connections(db_name))
                if time.time() - started > args.timeout:
                    raise RuntimeError(f"{kind} with {workers} workers timed out; see {folder}")
                time.sleep(0.05)
            ended = time.time()
        finally:
            for p in procs:
                p.send_signal(signal.SIGTERM)
            for p in procs:
                # SIGTERM drains for OVERNIGHT_WORKER_DRAIN_SECONDS; a starved machine takes longer.
                try:
                    p.wait(300)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        stats = [json.loads((folder / f"worker-{i}.json").read_text()) for i in range(workers)]
        with session_scope(settings) as session:
            last_done = session.scalar(
                select(func.max(Shard.heartbeat_at)).where(Shard.batch_id.in_(ids))
            )
            rows = session.execute(
                select(Batch.status, Batch.total, Batch.completed, Batch.failed).where(
                    Batch.id.in_(ids)
                )
            ).all()
        assert all(r.status == BatchStatus.COMPLETED for r in rows), rows
        held = [tuple(h) for s in stats for h in s["held"]]
        busy = sum(s["ended"] - s["started"] for s in stats) or 1.0
        claims = [c for s in stats for c, _got in s["claims"]]
        start = [c for s in stats for c, _got in s["claims"][:START_CLAIMS]]
        running = [c for s in stats for c, _got in s["claims"][START_CLAIMS:]]
        checkpoints = [c for s in stats for c in s["checkpoints"]]
        in_thread = [c for s in stats for c in s["claim_threads"]]
        problems = sum(
            len(_LOG_PROBLEMS.findall((folder / f"worker-{i}.log").read_text()))
            for i in range(workers)
        )
        total = sum(r.total for r in rows)
        return Run(
            workers=workers,
            requests=total,
            seconds=ended - started,
            run_seconds=(last_done or ended) - started,
            claim_share=sum(claims) / busy,
            checkpoint_share=sum(checkpoints) / busy,
            finalize_share=sum(f for s in stats for f in s["finalizing"]) / busy,
            claim_p50_ms=_p(claims, 50),
            claim_p99_ms=_p(claims, 99),
            running_claim_p99_ms=_p(running, 99),
            start_claim_max_ms=1000 * max(start, default=0.0),
            claim_thread_p99_ms=_p([wall for wall, _cpu in in_thread], 99),
            claim_cpu_p50_ms=_p([cpu for _wall, cpu in in_thread], 50),
            checkpoint_p99_ms=_p(checkpoints, 99),
            claims=len(held),
            twice=len(held) - len({shard for shard, _epoch in held}),
            unanswered=sum(r.total - r.completed - r.failed for r in rows),
            deadlocks=_deadlocks(db_name) - deadlocks,
            log_problems=problems,
            peak_connections=peak,
            cpu_ms_per_request=1000 * sum(s["cpu_seconds"] for s in stats) / total,
        )


def header(kind: str, requests: int) -> None:
    print(f"\n{kind}: {requests:,} requests")
    print(
        "| workers | req/s | speed-up | req/s to last shard | claiming | checkpointing "
        "| finalizing | claim p50 ms | claim p99 ms | claim p99 ms after the start "
        "| start claims max ms | claim p99 ms in its thread | claim CPU p50 ms "
        "| checkpoint p99 ms | shards claimed | twice | unanswered "
        "| deadlocks | log errors | peak connections | worker CPU ms/req |"
    )
    print("|" + "---|" * 21, flush=True)


def row(r: Run, one: float) -> None:
    """One worker count's line; `one` is one worker's requests/s."""
    rate = r.requests / r.seconds
    print(
        f"| {r.workers} | {rate:,.0f} | {rate / one:.1f}x | {r.requests / r.run_seconds:,.0f} "
        f"| {r.claim_share:.2%} | {r.checkpoint_share:.2%} | {r.finalize_share:.2%} "
        f"| {r.claim_p50_ms:.1f} | {r.claim_p99_ms:.1f} | {r.running_claim_p99_ms:.1f} "
        f"| {r.start_claim_max_ms:.1f} | {r.claim_thread_p99_ms:.1f} | {r.claim_cpu_p50_ms:.1f} "
        f"| {r.checkpoint_p99_ms:.1f} "
        f"| {r.claims} | {r.twice} | {r.unanswered} | {r.deadlocks} | {r.log_problems} "
        f"| {r.peak_connections} | {r.cpu_ms_per_request:.2f} |",
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--worker-id", help=argparse.SUPPRESS)
    parser.add_argument("--gate", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    parser.add_argument("--workers", default="1,2,4,8,16")
    parser.add_argument("--loads", default="one,mixed", help="one (a single batch), mixed")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--shard-lines", type=int, default=100)
    parser.add_argument("--delay", type=float, default=0.1, help="engine seconds per request")
    parser.add_argument("--max-num-seqs", type=int, default=8, help="in flight: twice this")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument(
        "--arrival",
        choices=("idle", "together"),
        default="idle",
        help="idle: the fleet runs when the load arrives; together: every worker starts at once",
    )
    parser.add_argument("--profile", action="store_true", help="cProfile each worker (.prof)")
    args = parser.parse_args()
    if args.worker:
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
        if not args.profile:
            return asyncio.run(_worker_main(args))
        import cProfile

        with cProfile.Profile() as profile:
            code = asyncio.run(_worker_main(args))
        profile.dump_stats(Path(args.stats).with_suffix(".prof"))
        return code
    base = Path(tempfile.mkdtemp(prefix="bench-claims-", dir="/tmp"))
    print(
        f"PostgreSQL {POSTGRES_ADMIN_URL.rsplit('@', 1)[-1]}, scripted engine: "
        f"{2 * args.max_num_seqs} in flight per worker, {args.delay * 1000:g} ms each "
        f"(one worker's ceiling {2 * args.max_num_seqs / args.delay:,.0f} req/s), "
        f"shards of {args.shard_lines} lines, {os.cpu_count()} cores, arrival {args.arrival}; "
        f"data in {base}"
    )
    counts = [int(n) for n in args.workers.split(",")]
    for kind in args.loads.split(","):
        header(kind, args.requests)
        one = 0.0
        for n in counts:
            result = run(args, kind, n, base)
            one = one or result.requests / result.seconds
            row(result, one)
    return 0


if __name__ == "__main__":
    sys.exit(main())
