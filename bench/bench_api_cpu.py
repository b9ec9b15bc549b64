"""CPU per request of retrieve and list, the ASGI app called directly in this process.

No socket, no server, no HTTP client: each request is one raw ASGI call of the app built
by `create_app` (every middleware, the access log written as `overnight api` writes it,
to /dev/null), so the figure is the app's own Python and database-driver cost. Measures
GET /v1/batches/{id}, GET /v1/batches?limit=20 and GET /v1/files/{id} with a member key,
from one caller and from 200 concurrent ones (tasks on the event loop), on SQLite and on a
fresh PostgreSQL database, as `time.process_time()` (every thread of the process: the
event loop and the threads the transactions run on) per request. The seeded batches are
`validating`: each retrieve also sums its (absent) shards, as a running batch's does.

`--before DIR` runs the same on another checkout (e.g. `git archive main | tar -x -C DIR`)
in a subprocess; `--profile CALL` prints a cProfile of one call instead.

    .venv/bin/python bench/bench_api_cpu.py [--requests 2000] [--repeat 2] [--before DIR]
    .venv/bin/python bench/bench_api_cpu.py --profile 'retrieve batch' --backends sqlite
"""

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# The checkout measured is the working directory's (`--before` runs this file in another).
sys.path.insert(0, os.getcwd())
ADMIN_KEY = "sk-bench-admin-" + "x" * 24
SEEDED = 20  # files and batches each
ROUNDS = 3
CALLS = ("retrieve batch", "list batches", "retrieve file")
CLIENTS = (1, 200)  # concurrent callers: one, and the load benchmark's

Asgi = Callable[[dict[str, Any], Any, Any], Coroutine[Any, Any, None]]


async def call(app: Asgi, path: str, key: str) -> tuple[int, bytes]:
    """One GET through the whole app; the status and the body."""
    target, _, query = path.partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": target,
        "raw_path": target.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"bench"), (b"authorization", f"Bearer {key}".encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    status = 0
    body = bytearray()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            body.extend(message.get("body", b""))

    await app(scope, receive, send)
    return status, bytes(body)


async def seed(app: Asgi) -> tuple[str, list[str], list[str]]:
    """A member key, and files and batches of its project (through the API itself)."""
    import httpx

    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(
        transport=transport,
        base_url="http://bench",
        headers={"authorization": f"Bearer {ADMIN_KEY}"},
    ) as admin:
        created = await admin.post(
            "/v1/admin/api_keys", json={"project": "bench", "role": "member"}
        )
        created.raise_for_status()
        key = created.json()["value"]
    line = (
        b'{"custom_id": "r-%d", "method": "POST", "url": "/v1/chat/completions", "body": '
        b'{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}}\n'
    )
    lines = b"".join(line % i for i in range(10))
    file_ids, batch_ids = [], []
    async with httpx.AsyncClient(
        transport=transport, base_url="http://bench", headers={"authorization": f"Bearer {key}"}
    ) as member:
        for i in range(SEEDED):
            uploaded = await member.post(
                "/v1/files", files={"file": (f"seed-{i}.jsonl", lines)}, data={"purpose": "batch"}
            )
            uploaded.raise_for_status()
            file_ids.append(uploaded.json()["id"])
            batch = await member.post(
                "/v1/batches",
                json={
                    "input_file_id": file_ids[-1],
                    "endpoint": "/v1/chat/completions",
                    "completion_window": "24h",
                },
            )
            batch.raise_for_status()
            batch_ids.append(batch.json()["id"])
    return key, batch_ids, file_ids


def paths_of(call_name: str, batch_ids: list[str], file_ids: list[str]) -> list[str]:
    return {
        "retrieve batch": [f"/v1/batches/{b}" for b in batch_ids],
        "list batches": ["/v1/batches?limit=20"],
        "retrieve file": [f"/v1/files/{f}" for f in file_ids],
    }[call_name]


async def cpu_ms(app: Asgi, key: str, paths: list[str], requests: int, clients: int) -> float:
    """CPU ms per request over `requests` requests from `clients` concurrent callers (the
    best of a few rounds)."""

    async def client(n: int, offset: int) -> None:
        for i in range(n):
            status, body = await call(app, paths[(offset + i) % len(paths)], key)
            assert status == 200, body

    async def load(total: int) -> None:
        shares = [total // clients + (i < total % clients) for i in range(clients)]
        await asyncio.gather(*(client(n, i) for i, n in enumerate(shares)))

    await load(max(200, clients))  # warm: connections in the pool, caches filled
    rounds = []
    for _ in range(ROUNDS):
        started = time.process_time()
        await load(requests)
        rounds.append((time.process_time() - started) / requests * 1000)
    return min(rounds)


async def measure(
    backend: str, data_dir: Path, requests: int, profile: str | None
) -> dict[str, float]:
    """`{"call, N clients": CPU ms}` on a fresh database of `backend`."""
    from app.config import Settings
    from app.logging import configure_logging
    from app.main import create_app, prepare_database
    from tests.harness import fresh_database

    # The access log as `overnight api` writes it (JSON, INFO), into /dev/null.
    stderr, sys.stderr = sys.stderr, open(os.devnull, "w")  # noqa: SIM115
    try:
        configure_logging("info", "json")
    finally:
        sys.stderr = stderr
    with fresh_database(backend, data_dir) as url:
        settings = Settings(data_dir=data_dir, database_url=url, admin_key=ADMIN_KEY)
        data_dir.mkdir(parents=True, exist_ok=True)
        app = create_app(settings)
        # What the lifespan does, without its background loops (housekeeping's CPU is not a
        # request's).
        app.state.access = prepare_database(settings)
        key, batch_ids, file_ids = await seed(app)
        if profile is not None:
            await run_profiled(app, key, paths_of(profile, batch_ids, file_ids), requests)
            return {}
        return {
            f"{name}, {clients}": await cpu_ms(
                app, key, paths_of(name, batch_ids, file_ids), requests, clients
            )
            for clients in CLIENTS
            for name in CALLS
        }


async def run_profiled(app: Asgi, key: str, paths: list[str], requests: int) -> None:
    """cProfile of sequential requests, the transactions run inline: cProfile sees only the
    thread that enabled it (the thread hop itself is what `cpu_ms` adds to this)."""
    import app.api.unit_of_work as unit_of_work

    class Inline(Executor):
        def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
            future: Future[Any] = Future()
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)
            return future

    unit_of_work._THREADS = Inline()  # type: ignore[assignment]
    await cpu_ms(app, key, paths, 200, 1)
    profiler = cProfile.Profile()
    profiler.enable()
    for i in range(requests):
        await call(app, paths[i % len(paths)], key)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(40)
    stats.sort_stats("cumulative").print_stats(80)
    print(out.getvalue())


Results = dict[str, dict[str, float]]  # backend -> "call, N clients" -> CPU ms


def run_here(backends: list[str], requests: int, profile: str | None) -> Results:
    with tempfile.TemporaryDirectory() as tmp:
        return {b: asyncio.run(measure(b, Path(tmp) / b, requests, profile)) for b in backends}


def run_checkout(root: Path, backends: list[str], requests: int) -> Results:
    """This script, run on a checkout's code (its own `app` package), in a fresh process."""
    args = ["--json", "--requests", str(requests), "--backends", ",".join(backends)]
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), *args],
        cwd=root,
        check=True,
        capture_output=True,
        text=True,
    )
    result: Results = json.loads(out.stdout.splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="per call and round")
    parser.add_argument("--backends", default="sqlite,postgresql")
    parser.add_argument("--repeat", type=int, default=2, help="fresh processes per version")
    parser.add_argument("--before", type=Path, help="a checkout of the version to compare with")
    parser.add_argument("--profile", choices=CALLS, help="cProfile one call instead")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    backends = args.backends.split(",")
    if args.profile:
        run_here(backends, args.requests, args.profile)
        return
    if args.json:
        print(json.dumps(run_here(backends, args.requests, None)))
        return
    roots = (
        {"after": ROOT} if args.before is None else {"before": args.before.resolve(), "after": ROOT}
    )
    versions: dict[str, Results] = {}
    # Versions take turns, so that a change in the machine's other load hits both alike.
    for _ in range(args.repeat):
        for name, root in roots.items():
            run = run_checkout(root, backends, args.requests)
            best = versions.setdefault(name, run)
            for b, figures in run.items():
                for measured, ms in figures.items():
                    best[b][measured] = min(best[b][measured], ms)
    print(
        f"CPU ms per request, the best of {args.repeat} x {ROUNDS} rounds of {args.requests} "
        "requests"
    )
    print(f"{'backend':<12}{'call, clients':<22}" + "".join(f"{v:>9}" for v in versions))
    for b in backends:
        for measured in versions["after"][b]:
            figures = [versions[v][b][measured] for v in versions]
            ratio = f"   x{figures[-1] / figures[0]:.2f}" if len(figures) > 1 else ""
            print(f"{b:<12}{measured:<22}" + "".join(f"{f:>9.2f}" for f in figures) + ratio)


if __name__ == "__main__":
    main()
