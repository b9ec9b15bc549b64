"""One worker switching models by demand against one worker per model taking turns by hand.

Same input for both (the bundled SmolLM2 for chat, greedy, `--max-tokens` each; the bundled
MiniLM for embeddings): `--batches` batches of `--lines` lines, alternating chat, embeddings,
chat, embeddings..., submitted one after another (`--gap` seconds apart), each arm on a fresh
data directory and database, its workers started cold with the first submission:

  (a) switching  one `overnight worker --models SmolLM2-135M-Instruct,all-MiniLM-L6-v2
                 --min-residency S`, switching between them by demand;
  (b) by hand    an operator starts the SmolLM2 worker, waits for every chat batch to
                 complete, stops it, starts the MiniLM worker and waits for the embedding
                 batches: both engine starts count.

For each: wall time from the first submission to the last batch completed, each batch's
completion, the worker's first start (process start to ready), switches made and the time
they took (the worker row's `engine_configuration["switching"]` for (a); SIGTERM of the
SmolLM2 worker to the MiniLM worker ready for (b)), and the ratio (a)/(b). Both arms must
produce the same greedy texts and the same embeddings; the switching worker's "holding" and
"leaving" log lines follow the table.

    .venv/bin/python bench/bench_switching.py [--lines 300] [--batches 4] [--max-tokens 8]
        [--gap 0] [--min-residency 0] [--shard-lines N] [--postgres ADMIN_URL]
"""

import argparse
import math
import os
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from server import api_server  # noqa: E402

CHAT_MODEL = "SmolLM2-135M-Instruct"
EMBEDDER = "all-MiniLM-L6-v2"
CHAT, EMBEDDINGS = "/v1/chat/completions", "/v1/embeddings"
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
ENGINE_ARGS = ["--enforce-eager"]
CHAT_ARGS = ["--max-model-len", "2048"]  # MiniLM keeps its own 256 in both arms
POLL_SECONDS = 0.2
TOPICS = ["rain", "cats", "the sea", "bread", "trains", "winter", "music", "stars", "maps"]


@dataclass(frozen=True)
class Job:
    """One batch of the run: its endpoint and its input file."""

    name: str
    endpoint: str
    data: bytes


@dataclass
class Outcome:
    arm: str
    wall: float
    first_start: float
    switches: int
    switching: float
    done_at: dict[str, float]
    outputs: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def jobs(batches: int, lines: int, max_tokens: int) -> list[Job]:
    out = []
    for b in range(batches):
        rows = []
        for i in range(lines):
            text = f"Write one sentence about {TOPICS[(b + i) % len(TOPICS)]} (batch {b}, {i})."
            if b % 2 == 0:
                messages = [{"role": "user", "content": text}]
                body: dict[str, Any] = {"model": CHAT_MODEL, "messages": messages}
                body |= {"max_tokens": max_tokens, "temperature": 0}
            else:
                body = {"model": EMBEDDER, "input": text}
            url = CHAT if b % 2 == 0 else EMBEDDINGS
            line = {"custom_id": f"b{b}-{i}", "method": "POST", "url": url, "body": body}
            rows.append(orjson.dumps(line) + b"\n")
        kind = "chat" if b % 2 == 0 else "embed"
        out.append(Job(f"{b + 1}:{kind}", CHAT if b % 2 == 0 else EMBEDDINGS, b"".join(rows)))
    return out


# -- a deployment: fresh data dir and database, the API in a subprocess, workers beside it --


@contextmanager
def database(work: Path, postgres: str | None) -> Iterator[str]:
    """A fresh SQLite file, or a fresh database on `postgres` (an admin URL), dropped after."""
    if postgres is None:
        yield f"sqlite:///{work / 'overnight.db'}"
        return
    import psycopg

    name = "bench_switching_" + secrets.token_hex(6)
    with psycopg.connect(postgres, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = postgres.rsplit("/", 1)[0].replace("postgresql://", "postgresql+psycopg://")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(postgres, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Deployment:
    data_dir: Path
    env: dict[str, str]
    client: openai.OpenAI
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start_worker(self, name: str, args: list[str]) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "app.cli", "worker", *args, "--worker-id", name]
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OVERNIGHT_")}
        with open(self.data_dir / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                command,
                env={**environ, **self.env, "PYTHONPATH": str(REPO)},
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        self.workers[name] = process
        return process

    def stop_worker(self, name: str) -> None:
        process = self.workers.pop(name)
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(120)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def row(self, name: str) -> Any:
        from app.config import Settings
        from app.db.models import RegisteredWorker
        from app.db.session import session_scope

        settings = Settings(  # type: ignore[call-arg]
            data_dir=self.data_dir, database_url=self.env["OVERNIGHT_DATABASE_URL"], _env_file=None
        )
        with session_scope(settings) as session:
            row = session.get(RegisteredWorker, name)
            if row is not None:
                session.expunge(row)
            return row

    def log(self, name: str) -> str:
        return (self.data_dir / f"{name}.log").read_text(errors="replace")


@contextmanager
def deployment(
    work: Path, model_dir: Path, postgres: str | None, shard_lines: int | None
) -> Iterator[Deployment]:
    data_dir = Path(tempfile.mkdtemp(prefix="deployment-", dir=work))
    # The converted SmolLM2 is shared: its one-off conversion is not the subject.
    (data_dir / "models").mkdir()
    (data_dir / "models" / model_dir.name).symlink_to(model_dir)
    with database(data_dir, postgres) as url:
        env = {**ENV, "OVERNIGHT_DATA_DIR": str(data_dir), "OVERNIGHT_DATABASE_URL": url}
        if shard_lines is not None:
            env["OVERNIGHT_SHARD_LINES"] = str(shard_lines)
        with api_server(env, log_path=data_dir / "api.log") as server:
            client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=5)
            running = Deployment(data_dir, env, client)
            try:
                yield running
            finally:
                for name in list(running.workers):
                    running.stop_worker(name)


# -- submitting and watching --


class Submitter(threading.Thread):
    """Submits the jobs in order, `gap` seconds apart from `started`."""

    def __init__(self, client: openai.OpenAI, run: list[Job], gap: float, started: float):
        super().__init__(daemon=True)
        self.client, self.run_jobs, self.gap, self.started = client, run, gap, started
        self.ids: dict[str, str] = {}

    def run(self) -> None:
        for k, job in enumerate(self.run_jobs):
            time.sleep(max(0.0, self.started + k * self.gap - time.monotonic()))
            upload = (f"{job.name}.jsonl", job.data, "application/jsonl")
            file_id = self.client.files.create(file=upload, purpose="batch").id
            batch = self.client.batches.create(
                input_file_id=file_id,
                endpoint=job.endpoint,  # type: ignore[arg-type]
                completion_window="24h",
            )
            self.ids[job.name] = batch.id


class Watch:
    """Polls the batches of `names` (and a worker's readiness) until every one is completed."""

    def __init__(self, running: Deployment, submitter: Submitter, started: float) -> None:
        self.running, self.submitter, self.started = running, submitter, started
        self.done_at: dict[str, float] = {}
        self.ready_at: dict[str, float] = {}

    def until_ready(self, worker: str) -> float:
        """Seconds from `started` until the worker's row says ready (its engine serves)."""
        while worker not in self.ready_at:
            self._look(set(), worker)
        return self.ready_at[worker]

    def until_done(self, names: set[str], worker: str | None = None) -> None:
        while not names <= set(self.done_at):
            self._look(names, worker)

    def _look(self, names: set[str], worker: str | None) -> None:
        time.sleep(POLL_SECONDS)
        now = time.monotonic() - self.started
        if worker is not None and worker not in self.ready_at:
            process = self.running.workers[worker]
            assert process.poll() is None, self.running.log(worker)[-3000:]
            row = self.running.row(worker)
            if row is not None and row.ready_at is not None and row.pid == process.pid:
                self.ready_at[worker] = now
        for name, batch_id in list(self.submitter.ids.items()):
            if name in self.done_at:
                continue
            batch = self.running.client.batches.retrieve(batch_id)
            assert batch.status not in ("failed", "expired", "cancelled"), batch
            if batch.status == "completed":
                counts = batch.request_counts
                assert counts is not None and counts.failed == 0, batch
                self.done_at[name] = now


def outputs(client: openai.OpenAI, ids: dict[str, str]) -> dict[str, Any]:
    """custom_id → the greedy text or the embedding vector."""
    found: dict[str, Any] = {}
    for batch_id in ids.values():
        batch = client.batches.retrieve(batch_id)
        for raw in client.files.content(batch.output_file_id or "").content.splitlines():
            line = orjson.loads(raw)
            body = line["response"]["body"]
            choices = body.get("choices")
            found[line["custom_id"]] = (
                choices[0]["message"]["content"] if choices else body["data"][0]["embedding"]
            )
    return found


# -- the two arms --


def said(line: str) -> str:
    """A log line's time of day and message, whether the worker logged text or JSON."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        return line
    return f"{record['ts'][11:23]} {record['message']}"


def run_switching(running: Deployment, run: list[Job], gap: float, residency: float) -> Outcome:
    args = ["--models", f"{CHAT_MODEL},{EMBEDDER}", "--min-residency", str(residency)]
    started = time.monotonic()
    running.start_worker("switcher", [*args, *ENGINE_ARGS, *CHAT_ARGS])
    submitter = Submitter(running.client, run, gap, started)
    submitter.start()
    watch = Watch(running, submitter, started)
    first_start = watch.until_ready("switcher")
    submitter.join()
    watch.until_done({job.name for job in run})
    wall = max(watch.done_at.values())
    shown = (running.row("switcher").engine_configuration or {}).get("switching", {})
    timeline = [
        said(line) for line in re.findall(r".*(?:holding|leaving) .*", running.log("switcher"))
    ]
    return Outcome(
        "(a) switching worker",
        wall,
        first_start,
        int(shown.get("switches", 0)),
        float(shown.get("switch_seconds", math.nan)),
        watch.done_at,
        outputs(running.client, submitter.ids),
        [f"row: {shown}", *timeline],
    )


def run_by_hand(running: Deployment, run: list[Job], gap: float) -> Outcome:
    started = time.monotonic()
    running.start_worker("chat", ["--model", CHAT_MODEL, *ENGINE_ARGS, *CHAT_ARGS])
    submitter = Submitter(running.client, run, gap, started)
    submitter.start()
    watch = Watch(running, submitter, started)
    first_start = watch.until_ready("chat")
    submitter.join()
    watch.until_done({job.name for job in run if job.endpoint == CHAT}, "chat")
    leaving = time.monotonic() - started
    running.stop_worker("chat")
    stopped = time.monotonic() - started
    running.start_worker("embed", ["--model", EMBEDDER, *ENGINE_ARGS])
    ready = watch.until_ready("embed")
    watch.until_done({job.name for job in run})
    notes = [
        f"chat worker ready at {first_start:.1f} s, stopped at {leaving:.1f} -> {stopped:.1f} s;"
        f" embedding worker started, ready at {ready:.1f} s ({ready - stopped:.1f} s)"
    ]
    return Outcome(
        "(b) one worker per model, by hand",
        max(watch.done_at.values()),
        first_start,
        1,
        ready - leaving,
        watch.done_at,
        outputs(running.client, submitter.ids),
        notes,
    )


# -- report --


def same_outputs(a: dict[str, Any], b: dict[str, Any]) -> str:
    texts = [k for k, v in a.items() if isinstance(v, str)]
    vectors = [k for k, v in a.items() if not isinstance(v, str)]
    same = sum(a[k] == b.get(k) for k in texts)
    worst = max(
        (max(abs(x - y) for x, y in zip(a[k], b[k], strict=True)) for k in vectors),
        default=0.0,
    )
    return f"greedy texts equal {same}/{len(texts)}, embeddings max |diff| {worst:.2e}"


def report(outcomes: list[Outcome], run: list[Job]) -> None:
    print(f"{'arm':<36} {'wall s':>7} {'1st start s':>11} {'switches':>8} {'switching s':>11}")
    for o in outcomes:
        print(
            f"{o.arm:<36} {o.wall:>7.1f} {o.first_start:>11.1f} {o.switches:>8} "
            f"{o.switching:>11.1f}"
        )
    for o in outcomes:
        done = ", ".join(f"{job.name} {o.done_at[job.name]:.1f}" for job in run)
        print(f"  {o.arm}: batches completed at (s) {done}")
        for note in o.notes:
            print(f"    {note}")
    if len(outcomes) == 2:
        a, b = outcomes
        print(
            f"(a)/(b): wall {a.wall / b.wall:.2f}x, switching "
            f"{a.switching / b.switching:.2f}x; {same_outputs(a.outputs, b.outputs)}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=300, help="lines per batch")
    parser.add_argument("--batches", type=int, default=4, help="alternating chat, embeddings")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--gap", type=float, default=0.0, help="seconds between submissions")
    parser.add_argument("--min-residency", type=float, default=0.0)
    parser.add_argument("--shard-lines", type=int, help="default: the deployment's (1000)")
    parser.add_argument("--arms", default="ab", help="which of (a), (b) to run")
    parser.add_argument(
        "--postgres",
        metavar="ADMIN_URL",
        help="a fresh database on this PostgreSQL server (e.g. postgresql://root@127.0.0.1:5432"
        "/postgres) instead of SQLite, dropped afterwards",
    )
    args = parser.parse_args()
    from worker.models import ensure_converted

    run = jobs(args.batches, args.lines, args.max_tokens)
    outcomes = []
    with tempfile.TemporaryDirectory(prefix="bench-switching-") as tmp:
        work = Path(tmp)
        model_dir = ensure_converted(work / "models-data")
        arms = {
            "a": lambda d: run_switching(d, run, args.gap, args.min_residency),
            "b": lambda d: run_by_hand(d, run, args.gap),
        }
        for key in args.arms:
            with deployment(work, model_dir, args.postgres, args.shard_lines) as running:
                outcomes.append(arms[key](running))
            print(f"  {outcomes[-1].arm}: {outcomes[-1].wall:.1f} s", flush=True)
    print(
        f"{args.batches} batches of {args.lines} lines (chat max_tokens {args.max_tokens}, "
        f"temperature 0 / embeddings), {args.gap:g} s apart, --min-residency "
        f"{args.min_residency:g}, {'PostgreSQL' if args.postgres else 'SQLite'}"
    )
    report(outcomes, run)


if __name__ == "__main__":
    main()
