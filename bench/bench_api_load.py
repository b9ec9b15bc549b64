"""Retrieve / list under 200 concurrent clients, idle and while an upload and a batch run.

Starts `overnight api` as a subprocess on SQLite and on a fresh PostgreSQL database, seeds
a member key, files and batches, and hammers GET /v1/batches/{id}, GET /v1/batches and
GET /v1/files/{id} from a pool of load-generator processes (httpx, each process a share of
the clients on its own event loop, so the client is not the bottleneck of one core).
Per backend, three phases:

- `idle`: the API load alone;
- `worker alone`: a batch running on the scripted-engine worker (tests/fake_worker.py),
  no API load: the worker's lines/s on an idle API;
- `loaded`: the API load while 200 MB uploads follow one another and the batch runs:
  the API's figures, and the worker's lines/s as a ratio of `worker alone`.

Each load phase runs twice with wrk: `max`, every client sending its next request as soon
as the last is answered (the API's ceiling; latency is then clients / throughput, by
Little's law), and `@RATE/s`, the same clients pacing themselves (exponential think times)
to offer `--rate` requests/s in all: the latency the API gives at that throughput.

The load comes from `wrk` (Debian's `apt-get install wrk`: C, epoll, a fraction of the CPU
an httpx client spends per request, so on a 2-core machine the API rather than the client is
measured) when it is installed, else from the httpx processes (`--generator` chooses).

`--before DIR` runs the same on another checkout (e.g. `git archive e0da28f | tar -x -C DIR`)
and prints after/before ratios.

    .venv/bin/python bench/bench_api_load.py [--clients 200] [--seconds 20] [--before DIR]
"""

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import get_context
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_files import make_jsonl
from server import ROOT, api_server

from tests.harness import fresh_database

ADMIN_KEY = "sk-bench-admin-" + "x" * 24
MB = 1_000_000
WARMUP_SECONDS = 2.0
SEEDED = 20  # batches and files each


@dataclass(frozen=True)
class Target:
    url: str
    key: str
    batch_ids: list[str]
    file_ids: list[str]


@dataclass
class Sample:
    """One load generator's outcome: start times and latencies of answered requests."""

    started: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)


# --- the load generator (runs in child processes) ---------------------------------------


async def _client(http: httpx.AsyncClient, target: Target, until: float, sample: Sample) -> None:
    paths = itertools.cycle(
        [
            *(f"/v1/batches/{b}" for b in target.batch_ids),
            "/v1/batches?limit=20",
            *(f"/v1/files/{f}" for f in target.file_ids),
        ]
    )
    for _ in range(random.randrange(2 * SEEDED)):
        next(paths)  # clients do not walk in step
    while (now := time.time()) < until:
        try:
            response = await http.get(next(paths))
            ok = response.status_code == 200
            kind = str(response.status_code)
        except httpx.HTTPError as exc:
            ok, kind = False, type(exc).__name__
        if ok:
            sample.started.append(now)
            sample.latencies.append(time.time() - now)
        else:
            sample.errors[kind] = sample.errors.get(kind, 0) + 1


async def _generate(target: Target, clients: int, start: float, until: float) -> Sample:
    # Keep-alive below uvicorn's 5 s, so no request goes out on a connection it just closed.
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=4
    )
    headers = {"authorization": f"Bearer {target.key}"}
    sample = Sample()
    async with httpx.AsyncClient(
        base_url=target.url, limits=limits, headers=headers, timeout=60
    ) as http:
        await asyncio.sleep(max(0.0, start - time.time()))
        await asyncio.gather(*(_client(http, target, until, sample) for _ in range(clients)))
    return sample


def ready(seconds: float) -> None:
    time.sleep(seconds)  # holds this process busy, so that the pool starts another


def generate(target: Target, clients: int, start: float, until: float) -> Sample:
    return asyncio.run(_generate(target, clients, start, until))


# --- phases -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadResult:
    requests: int
    per_second: float
    p50_ms: float
    p99_ms: float
    errors: dict[str, int]
    # The API process's CPU (user + system) per answered request over the whole phase: a
    # figure that other load on a shared machine changes much less than requests/s.
    cpu_ms: float = 0.0


def cpu_seconds(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def run_load(
    pool: ProcessPoolExecutor, target: Target, pid: int, clients: int, procs: int, seconds: float
) -> LoadResult:
    cpu_before = cpu_seconds(pid)
    start = time.time() + 1.0  # every generator's event loop is up by then
    until = start + WARMUP_SECONDS + seconds
    shares = [clients // procs + (i < clients % procs) for i in range(procs)]
    futures = [pool.submit(generate, target, n, start, until) for n in shares]
    samples = [f.result() for f in futures]
    cpu = cpu_seconds(pid) - cpu_before
    answered = sum(len(s.latencies) for s in samples)
    measured_from = start + WARMUP_SECONDS
    latencies = [
        lat
        for s in samples
        for t, lat in zip(s.started, s.latencies, strict=True)
        if t >= measured_from
    ]
    errors: dict[str, int] = {}
    for s in samples:
        for kind, n in s.errors.items():
            errors[kind] = errors.get(kind, 0) + n
    if len(latencies) < 2:
        return LoadResult(len(latencies), 0.0, 0.0, 0.0, errors)
    q = statistics.quantiles(latencies, n=100)
    return LoadResult(
        len(latencies),
        len(latencies) / seconds,
        q[49] * 1000,
        q[98] * 1000,
        errors,
        cpu / max(answered, 1) * 1000,
    )


WRK_SCRIPT = """
local paths = {%(paths)s}
local i = 0
function init(args)
  i = math.random(#paths)
end
function request()
  i = i %% #paths + 1
  return wrk.format("GET", paths[i], {["Authorization"] = "Bearer %(key)s"})
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{"requests": %%d, "seconds": %%f, "p50": %%d, "p99": %%d, "connect": %%d, "read": %%d, '
    .. '"write": %%d, "status": %%d, "timeout": %%d}\\n',
    summary.requests, summary.duration / 1e6, latency:percentile(50), latency:percentile(99),
    e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def _wrk(target: Target, clients: int, threads: int, seconds: float, script: Path) -> dict:
    command = ["wrk", f"-t{threads}", f"-c{clients}", f"-d{seconds:g}s", "--timeout", "30s"]
    out = subprocess.run(
        [*command, "-s", str(script), target.url], capture_output=True, text=True, check=True
    ).stdout
    summary: dict = json.loads(out.strip().splitlines()[-1])
    return summary


def run_wrk(
    target: Target, pid: int, clients: int, threads: int, seconds: float, rate: float | None
) -> LoadResult:
    """The same loop of `clients` keep-alive connections, driven by wrk; with `rate`, each
    connection waits an exponential think time so that all offer `rate` requests/s."""
    paths = [
        *(f"/v1/batches/{b}" for b in target.batch_ids),
        "/v1/batches?limit=20",
        *(f"/v1/files/{f}" for f in target.file_ids),
    ]
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as script:
        quoted = ", ".join(f'"{p}"' for p in paths)
        script.write(WRK_SCRIPT % {"paths": quoted, "key": target.key})
        if rate:
            think_ms = clients / rate * 1000
            script.write(
                f"function delay()\n  return -math.log(1 - math.random()) * {think_ms}\nend\n"
            )
        script.flush()
        _wrk(target, clients, threads, WARMUP_SECONDS, Path(script.name))
        cpu_before = cpu_seconds(pid)
        summary = _wrk(target, clients, threads, seconds, Path(script.name))
        cpu = cpu_seconds(pid) - cpu_before
    kinds = ("connect", "read", "write", "status", "timeout")
    errors = {kind: summary[kind] for kind in kinds if summary[kind]}
    answered = summary["requests"] - summary["status"]
    return LoadResult(
        answered,
        answered / summary["seconds"],
        summary["p50"] / 1000,
        summary["p99"] / 1000,
        errors,
        cpu / max(answered, 1) * 1000,
    )


def seed(url: str) -> Target:
    admin = httpx.Client(base_url=url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=60)
    created = admin.post("/v1/admin/api_keys", json={"project": "bench", "role": "member"})
    created.raise_for_status()
    member = httpx.Client(
        base_url=url, headers={"authorization": f"Bearer {created.json()['value']}"}, timeout=60
    )
    lines = b"".join(
        b'{"custom_id": "r-%d", "method": "POST", "url": "/v1/chat/completions", "body": '
        b'{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}}\n'
        % i
        for i in range(10)
    )
    file_ids, batch_ids = [], []
    for i in range(SEEDED):
        uploaded = member.post(
            "/v1/files", files={"file": (f"seed-{i}.jsonl", lines)}, data={"purpose": "batch"}
        )
        uploaded.raise_for_status()
        file_ids.append(uploaded.json()["id"])
        batch = member.post(
            "/v1/batches",
            json={
                "input_file_id": file_ids[-1],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        batch.raise_for_status()
        batch_ids.append(batch.json()["id"])
    return Target(url, created.json()["value"], batch_ids, file_ids)


class RunningBatch:
    """A large batch on the scripted-engine worker; `completed()` reads its progress."""

    def __init__(self, url: str, key: str, source: Path) -> None:
        self.http = httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=60
        )
        with source.open("rb") as f:
            uploaded = self.http.post(
                "/v1/files", files={"file": ("batch.jsonl", f)}, data={"purpose": "batch"}
            )
        uploaded.raise_for_status()
        batch = self.http.post(
            "/v1/batches",
            json={
                "input_file_id": uploaded.json()["id"],
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
            },
        )
        batch.raise_for_status()
        self.batch_id = batch.json()["id"]

    def completed(self) -> tuple[float, int]:
        counts = self.http.get(f"/v1/batches/{self.batch_id}").json()["request_counts"]
        return time.monotonic(), counts["completed"] + counts["failed"]

    def wait_running(self, timeout: float = 300) -> None:
        """Until the worker has finished its first lines (validated, claimed, running)."""
        deadline = time.monotonic() + timeout
        while self.completed()[1] == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("the batch did not start running")
            time.sleep(0.5)

    def rate(self, seconds: float) -> float:
        """Lines per second the worker finishes over the next `seconds`."""
        t0, n0 = self.completed()
        time.sleep(seconds)
        t1, n1 = self.completed()
        return (n1 - n0) / (t1 - t0)


@contextmanager
def fake_worker(root: Path, env: dict[str, str], delay: float) -> Iterator[None]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("OVERNIGHT_")}
    full_env.update({"PYTHONPATH": str(root), **env})
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_worker", "--worker-id", "bench", "--delay", str(delay)],
        cwd=root,
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def uploads(url: str, key: str, source: Path) -> Iterator[list[float]]:
    """200 MB uploads one after another until the block ends; yields their MB/s."""
    stop = threading.Event()
    speeds: list[float] = []

    def loop() -> None:
        with httpx.Client(
            base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=300
        ) as http:
            while not stop.is_set():
                started = time.perf_counter()
                with source.open("rb") as f:
                    r = http.post(
                        "/v1/files", files={"file": ("big.jsonl", f)}, data={"purpose": "batch"}
                    )
                r.raise_for_status()
                speeds.append(source.stat().st_size / MB / (time.perf_counter() - started))
                http.delete(f"/v1/files/{r.json()['id']}").raise_for_status()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield speeds
    finally:
        stop.set()
        thread.join()


@dataclass
class BackendResult:
    idle: dict[str, LoadResult]
    loaded: dict[str, LoadResult]
    worker_alone: float
    worker_loaded: float
    upload_speeds: list[float]


def load(
    args: argparse.Namespace, pool: ProcessPoolExecutor, target: Target, pid: int
) -> dict[str, LoadResult]:
    """The phase's figures: `max`, and with wrk also paced at `--rate`."""
    if args.generator == "httpx":
        return {"max": run_load(pool, target, pid, args.clients, args.procs, args.seconds)}
    return {
        "max": run_wrk(target, pid, args.clients, args.procs, args.seconds, None),
        f"@{args.rate:g}/s": run_wrk(
            target, pid, args.clients, args.procs, args.seconds, args.rate
        ),
    }


def bench_backend(
    args: argparse.Namespace, root: Path, backend: str, tmp: Path, big: Path, batch: Path
) -> BackendResult:
    data_dir = tmp / backend
    with fresh_database(backend, data_dir) as db_url:
        env = {
            "OVERNIGHT_DATA_DIR": str(data_dir),
            "OVERNIGHT_DATABASE_URL": db_url,
            "OVERNIGHT_ADMIN_KEY": ADMIN_KEY,
        }
        with (
            api_server(env, root=root) as server,
            ProcessPoolExecutor(args.procs, mp_context=get_context("spawn")) as pool,
        ):
            # Every generator process started and imported before the clock starts.
            list(pool.map(ready, [1.0] * args.procs))
            target = seed(server.url)
            idle = load(args, pool, target, server.pid)
            running = RunningBatch(server.url, target.key, batch)
            with fake_worker(root, env, args.delay):
                running.wait_running()
                worker_alone = running.rate(args.seconds)
                with uploads(server.url, target.key, big) as speeds:
                    time.sleep(1)
                    t0, n0 = running.completed()
                    loaded = load(args, pool, target, server.pid)
                    t1, n1 = running.completed()
            return BackendResult(idle, loaded, worker_alone, (n1 - n0) / (t1 - t0), speeds)


def report(name: str, results: dict[str, BackendResult]) -> None:
    print(f"\n{name}")
    print(
        f"{'backend':<11}{'phase':<16}{'req/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
        f"{'CPU ms/req':>11}  worker lines/s"
    )
    for backend, r in results.items():
        uploads = (
            f"{len(r.upload_speeds)} uploads of 200 MB, "
            f"{statistics.median(r.upload_speeds) if r.upload_speeds else 0:.0f} MB/s"
        )
        loaded = f"{r.worker_loaded / max(r.worker_alone, 1e-9):.1%} of API idle"
        for phase, loads, worker in (
            ("idle", r.idle, f"{r.worker_alone:.0f} (API idle)"),
            ("loaded", r.loaded, f"{r.worker_loaded:.0f} ({loaded}); {uploads}"),
        ):
            for pace, load in loads.items():
                errs = sum(load.errors.values())
                print(
                    f"{backend:<11}{phase + ' ' + pace:<16}{load.per_second:>8.0f}"
                    f"{load.p50_ms:>9.1f}{load.p99_ms:>9.1f}{errs:>8}{load.cpu_ms:>11.2f}  {worker}"
                    + (f"  {load.errors}" if errs else "")
                )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument(
        "--procs", type=int, default=4, help="load-generator processes (wrk: threads)"
    )
    parser.add_argument(
        "--generator", choices=["wrk", "httpx"], default="wrk" if shutil.which("wrk") else "httpx"
    )
    parser.add_argument("--seconds", type=float, default=20, help="measured seconds per phase")
    parser.add_argument("--delay", type=float, default=0.02, help="scripted engine s/request")
    parser.add_argument("--rate", type=float, default=500, help="requests/s of the paced runs")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--before", type=Path, help="a checkout of the version to compare with")
    args = parser.parse_args()
    backends = args.backends.split(",")
    versions = {"after (this checkout)": ROOT}
    if args.before:
        versions = {"before": args.before.resolve(), **versions}
    print(
        f"{args.clients} concurrent clients from {args.generator} in {args.procs} "
        f"{'threads' if args.generator == 'wrk' else 'processes'}, {args.seconds:g} s a phase"
    )
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        make_jsonl(tmp / "big.jsonl", 200 * MB)
        make_jsonl(tmp / "batch.jsonl", 8 * MB)
        results: dict[str, dict[str, BackendResult]] = {}
        for name, root in versions.items():
            results[name] = {
                b: bench_backend(
                    args, root, b, tmp / name.split()[0], tmp / "big.jsonl", tmp / "batch.jsonl"
                )
                for b in backends
            }
            report(name, results[name])
    if args.before:
        before, after = results["before"], results["after (this checkout)"]
        print("\nafter / before")
        for b in backends:
            for phase in ("idle", "loaded"):
                olds, news = getattr(before[b], phase), getattr(after[b], phase)
                for pace in news.keys() & olds.keys():
                    old, new = olds[pace], news[pace]
                    print(
                        f"{b:<11}{phase} {pace:<10} "
                        f"req/s x{new.per_second / max(old.per_second, 1e-9):.1f}, "
                        f"p99 x{new.p99_ms / max(old.p99_ms, 1e-9):.2f}, "
                        f"CPU/request x{new.cpu_ms / max(old.cpu_ms, 1e-9):.2f}"
                    )


if __name__ == "__main__":
    main()
