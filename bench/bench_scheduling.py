"""Scheduling, first come first served (`OVERNIGHT_SCHEDULER=fifo`) against the new rule.

Real API process, real worker processes (`tests/fake_worker.py`: the worker's own loop, claim,
checkpoints and finalizer, with the scripted engine answering each request after `--delay`
seconds, `max_num_seqs` 4, so 8 requests in flight per worker), PostgreSQL, the SDK.
Scenarios, each run under both orders:

  (i)   project A submits a 20,000-request batch, project B 10 s later a 100-request batch:
        B's time from creation to completion;
  (ii)  three projects with weights 1:1:2 keep a batch each queued: each one's share of the
        tokens made over a measured window (shortened from ten minutes, see --share-seconds);
  (iii) overload with a short and a long completion window, time scaled down
        (`OVERNIGHT_COMPLETION_WINDOWS`, "1h" = --short-window seconds): requests expired;
  (iv)  the planner's ETA error (estimated finish against the batch's real finish) at 25, 50
        and 75 % of each finished batch: the bench polls every open batch's ETA fields (what
        the API's schedule shows) with its progress, from outside.

    .venv/bin/python bench/bench_scheduling.py [--workers 2] [--delay 0.05]
"""

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from app.config import Settings  # noqa: E402
from app.db.models import Batch, BatchSchedule, Project, Shard  # noqa: E402
from app.db.session import engine_for, session_scope  # noqa: E402
from bench.server import api_server  # noqa: E402
from tests.harness import fresh_database  # noqa: E402

ADMIN = "sk-bench-admin"
MODEL = "SmolLM2-135M-Instruct"
TERMINAL = ("completed", "failed", "expired", "cancelled")


@dataclass(frozen=True)
class Estimate:
    """A batch's ETA as the planner wrote it, and the requests the batch had done then."""

    made_at: float
    done: int
    total: int
    finish_at: float | None


class EtaWatch:
    """Every open batch's ETA fields, polled while the bench runs: each new estimate, and the
    standing one again each time the batch did another twentieth of its requests."""

    def __init__(self, settings: Settings, every: float = 0.5) -> None:
        self.settings = settings
        self.every = every
        self.seen: dict[str, list[Estimate]] = defaultdict(list)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> "EtaWatch":
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _watch(self) -> None:
        done = func.sum(Shard.completed + Shard.failed)
        query = (
            select(
                Batch.id,
                BatchSchedule.eta_made_at,
                done,
                Batch.total,
                BatchSchedule.eta_finish_at,
            )
            .join(BatchSchedule, BatchSchedule.batch_id == Batch.id)
            .join(Shard, Shard.batch_id == Batch.id)
            .where(Batch.status == "in_progress", BatchSchedule.eta_made_at.is_not(None))
            .group_by(Batch.seq, BatchSchedule.batch_id)
        )
        while not self._stop.wait(self.every):
            with session_scope(self.settings) as session:
                rows = session.execute(query).all()
            for batch_id, made_at, done_now, total, finish_at in rows:
                now = Estimate(made_at, int(done_now or 0), total, finish_at)
                seen = self.seen[batch_id]
                if not seen or self._moved_on(seen[-1], now):
                    seen.append(now)

    @staticmethod
    def _moved_on(last: Estimate, now: Estimate) -> bool:
        return last.made_at != now.made_at or now.done >= last.done + now.total / 20


@dataclass
class Run:
    order: str
    url: str
    settings: Settings
    etas: EtaWatch
    clients: dict[str, openai.OpenAI] = field(default_factory=dict)

    def client(self, project: str) -> openai.OpenAI:
        if project not in self.clients:
            admin = openai.OpenAI(base_url=self.url + "/v1", api_key=ADMIN, max_retries=2)
            key = admin.post("/admin/api_keys", body={"project": project}, cast_to=dict)["value"]
            self.clients[project] = openai.OpenAI(
                base_url=self.url + "/v1", api_key=key, max_retries=2
            )
        return self.clients[project]

    def submit(self, project: str, n: int, window: str = "24h") -> str:
        lines = b"".join(
            orjson.dumps(
                {
                    "custom_id": f"{project}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": MODEL, "messages": [{"role": "user", "content": f"q{i}"}]},
                }
            )
            + b"\n"
            for i in range(n)
        )
        api = self.client(project)
        file_id = api.files.create(file=("in.jsonl", lines), purpose="batch").id
        return api.batches.create(
            input_file_id=file_id,
            endpoint="/v1/chat/completions",
            completion_window=window,  # type: ignore[arg-type]
        ).id

    def wait(self, project: str, batch_id: str, timeout: float = 900) -> openai.types.Batch:
        deadline = time.monotonic() + timeout
        while True:
            batch = self.client(project).batches.retrieve(batch_id)
            if batch.status in TERMINAL or time.monotonic() > deadline:
                return batch
            time.sleep(0.25)

    def weight(self, project: str, weight: float) -> None:
        self.client(project)
        admin = openai.OpenAI(base_url=self.url + "/v1", api_key=ADMIN)
        admin.post(f"/admin/projects/{project}", body={"weight": weight}, cast_to=dict)


@contextmanager
def deployment(order: str, args: argparse.Namespace, work: Path) -> Iterator[Run]:
    """API + `--workers` worker processes on a fresh PostgreSQL database."""
    data = Path(tempfile.mkdtemp(dir=work))
    with fresh_database("postgresql", data) as url:
        env = {
            "OVERNIGHT_DATABASE_URL": url,
            "OVERNIGHT_DATA_DIR": str(data),
            "OVERNIGHT_ADMIN_KEY": ADMIN,
            "OVERNIGHT_SCHEDULER": order,
            "OVERNIGHT_SHARD_LINES": str(args.shard_lines),
            "OVERNIGHT_HOUSEKEEPING_INTERVAL_SECONDS": "1",
            "OVERNIGHT_COMPLETION_WINDOWS": orjson.dumps(
                {"24h": args.long_window, "1h": args.short_window}
            ).decode(),
            "OVERNIGHT_LOG_FORMAT": "text",
        }
        with api_server(env, data / "api.log", start_timeout=600) as server:
            full = {
                **{k: v for k, v in os.environ.items() if not k.startswith("OVERNIGHT_")},
                **env,
            }
            workers = [
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.fake_worker",
                        "--worker-id",
                        f"w{i}",
                        "--delay",
                        str(args.delay),
                    ],
                    cwd=ROOT,
                    env=full,
                    stdout=subprocess.DEVNULL,
                    stderr=(data / f"w{i}.log").open("wb"),
                )
                for i in range(args.workers)
            ]
            settings = Settings(data_dir=data, database_url=url, _env_file=None)  # type: ignore[call-arg]
            try:
                with EtaWatch(settings) as etas:
                    yield Run(order, server.url, settings, etas)
            finally:
                for w in workers:
                    w.terminate()
                for w in workers:
                    w.wait(60)
                engine_for(url).dispose()


def late_small_batch(run: Run) -> float:
    big = run.submit("A", 20_000)
    time.sleep(10)
    small = run.submit("B", 100)
    done = run.wait("B", small)
    assert done.status == "completed" and done.completed_at is not None
    took = done.completed_at - done.created_at
    if run.client("A").batches.retrieve(big).status not in TERMINAL:
        run.client("A").batches.cancel(big)
    return float(took)


def _tokens_by_project(run: Run) -> dict[str, int]:
    with session_scope(run.settings) as session:
        rows = session.execute(
            select(Project.name, func.sum(Shard.output_tokens))
            .join(Batch, Batch.project_id == Project.id)
            .join(Shard, Shard.batch_id == Batch.id)
            .group_by(Project.name)
        ).all()
    return {name: int(tokens or 0) for name, tokens in rows}


def weighted_shares(run: Run, seconds: float) -> dict[str, float]:
    weights = {"P1": 1.0, "P2": 1.0, "P3": 2.0}
    batches = []
    for project, weight in weights.items():
        run.weight(project, weight)
        batches.append((project, run.submit(project, 20_000)))
    time.sleep(10)  # every project has work running
    before = _tokens_by_project(run)
    time.sleep(seconds)
    after = _tokens_by_project(run)
    for project, batch_id in batches:
        if run.client(project).batches.retrieve(batch_id).status not in TERMINAL:
            run.client(project).batches.cancel(batch_id)
    made = {p: after.get(p, 0) - before.get(p, 0) for p in weights}
    total = sum(made.values()) or 1
    return {p: made[p] / total for p in weights}


def _expired(batch: openai.types.Batch) -> int:
    """`request_counts.expired`: ours, beside OpenAI's fields."""
    return int(getattr(batch.request_counts, "expired", 0) or 0)


def overload(run: Run, short_window: float) -> tuple[int, int, list[str]]:
    """A long-window batch, then short-window ones arriving while it runs."""
    submitted = [("L", run.submit("L", 20_000))]
    for i in range(3):
        time.sleep(short_window / 8)
        submitted.append((f"S{i}", run.submit(f"S{i}", 5_000, window="1h")))
    time.sleep(short_window / 2)
    with session_scope(run.settings) as session:
        flagged = list(
            session.scalars(
                select(BatchSchedule.batch_id).where(BatchSchedule.expected_miss.is_(True))
            )
        )
    ends = [run.wait(project, batch_id) for project, batch_id in submitted]
    expired = sum(_expired(b) for b in ends[1:])
    expired_long = _expired(ends[0])
    names = {b: p for p, b in submitted}
    return expired, expired_long, [names[b] for b in flagged if b in names]


def eta_errors(run: Run) -> dict[int, list[float]]:
    """Per progress mark, |estimated finish - real finish| / real time left, per batch."""
    marks: dict[int, list[float]] = {25: [], 50: [], 75: []}
    with session_scope(run.settings) as session:
        finished = session.execute(
            select(Batch.id, Batch.finalizing_at).where(Batch.status == "completed")
        ).all()
    for batch_id, finish in finished:
        rows = run.etas.seen.get(batch_id, [])
        for mark in marks:
            hit = next((r for r in rows if r.total and r.done >= r.total * mark / 100), None)
            if hit is None or hit.finish_at is None or finish is None:
                continue
            if hit.made_at >= finish:
                # Made once every request had finished (a batch of one shard reports its
                # progress with its last checkpoint): no prediction to score.
                print(f"{run.order} ETA at {mark} % of {batch_id}: none before it finished")
                continue
            left = max(finish - hit.made_at, 1.0)
            marks[mark].append(abs(hit.finish_at - finish) / left)
            print(
                f"{run.order} ETA at {mark} % of {batch_id} ({hit.total} requests): "
                f"off by {hit.finish_at - finish:+.1f} s, {finish - hit.made_at:.1f} s left",
                flush=True,
            )
    return marks


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--delay", type=float, default=0.05, help="seconds per request")
    parser.add_argument("--shard-lines", type=int, default=500)
    parser.add_argument("--share-seconds", type=float, default=120.0)
    parser.add_argument("--short-window", type=float, default=60.0, help='"1h", in seconds')
    parser.add_argument("--long-window", type=float, default=3600.0, help='"24h", in seconds')
    parser.add_argument("--orders", default="fifo,fair", help="comma-separated")
    parser.add_argument("--results", type=Path, default=Path("bench-scheduling.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-scheduling-"))
    results: dict[str, dict[str, Any]] = {}
    if args.results.exists():
        results.update(orjson.loads(args.results.read_bytes()))
    for order in args.orders.split(","):
        r: dict[str, Any] = {}
        # One deployment per order: each scenario's projects are new ones.
        with deployment(order, args, work) as run:
            r["b_seconds"] = late_small_batch(run)
            print(order, "B done in", r["b_seconds"], flush=True)
            r["shares"] = weighted_shares(run, args.share_seconds)
            print(order, "shares", r["shares"], flush=True)
            r["expired"], r["expired_long"], r["flagged"] = overload(run, args.short_window)
            print(order, "expired", r["expired"], r["expired_long"], r["flagged"], flush=True)
            r["eta"] = {str(k): v for k, v in eta_errors(run).items()}
        results[order] = r
        args.results.write_bytes(orjson.dumps(results))
    if set(results) != {"fifo", "fair"}:
        return

    def pct(v: float) -> str:
        return f"{100 * v:.1f} %"

    def eta(order: str, mark: int) -> str:
        errors = sorted(results[order]["eta"][str(mark)])
        if not errors:
            return "n/a"
        return f"median {pct(errors[len(errors) // 2])}, max {pct(errors[-1])} ({len(errors)})"

    print(f"\nworkers {args.workers}, {args.delay}s/request, shard_lines {args.shard_lines}")
    print("| measure | FIFO | fair share + deadlines |")
    print("|---|---|---|")
    print(
        f"| (i) B's 100 requests, creation → completed | {results['fifo']['b_seconds']:.0f} s "
        f"| {results['fair']['b_seconds']:.0f} s |"
    )
    for p, w in (("P1", 1), ("P2", 1), ("P3", 2)):
        print(
            f"| (ii) token share of {p} (weight {w}, target {pct(w / 4)}) | "
            f"{pct(results['fifo']['shares'][p])} | {pct(results['fair']['shares'][p])} |"
        )
    print(
        f"| (iii) short-window requests expired (of 15,000) | {results['fifo']['expired']} | "
        f"{results['fair']['expired']} |"
    )
    print(
        f"| (iii) long-window requests expired (of 20,000) | {results['fifo']['expired_long']} | "
        f"{results['fair']['expired_long']} |"
    )
    print(
        f"| (iii) batches the planner expected to miss | {results['fifo']['flagged']} | "
        f"{results['fair']['flagged']} |"
    )
    for mark in (25, 50, 75):
        print(
            f"| (iv) ETA error at {mark} % (of the time left) | {eta('fifo', mark)} | "
            f"{eta('fair', mark)} |"
        )


if __name__ == "__main__":
    main()
