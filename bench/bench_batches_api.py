"""Latency of create / retrieve / list under 200 concurrent clients (asyncio + httpx).

Starts `overnight api` as a subprocess (SQLite by default; `--postgres` adds a run on
a fresh PostgreSQL database), uploads one small batch file, then lets every client
create, retrieve and list batches in turn. Prints p50/p99 per operation.

    .venv/bin/python bench/bench_batches_api.py [--clients 200] [--rounds 5] [--postgres]
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server import api_server

from tests.harness import fresh_database

REQUEST = (
    b'{"custom_id": "r-%d", "method": "POST", "url": "/v1/chat/completions", "body": '
    b'{"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}]}}\n'
)


async def client_run(
    http: httpx.AsyncClient, file_id: str, rounds: int, timings: dict[str, list[float]]
) -> None:
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    for _ in range(rounds):
        started = time.perf_counter()
        created = await http.post("/v1/batches", json=body)
        timings["create"].append(time.perf_counter() - started)
        assert created.status_code == 200, created.text
        started = time.perf_counter()
        got = await http.get(f"/v1/batches/{created.json()['id']}")
        timings["retrieve"].append(time.perf_counter() - started)
        assert got.status_code == 200, got.text
        started = time.perf_counter()
        listed = await http.get("/v1/batches", params={"limit": 20})
        timings["list"].append(time.perf_counter() - started)
        assert listed.status_code == 200, listed.text


async def load(url: str, clients: int, rounds: int) -> tuple[dict[str, list[float]], float]:
    # Below uvicorn's 5 s keep-alive, so that no request goes out on a connection it closed.
    limits = httpx.Limits(
        max_connections=clients, max_keepalive_connections=clients, keepalive_expiry=2
    )
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=120) as http:
        data = b"".join(REQUEST % i for i in range(10))
        uploaded = await http.post(
            "/v1/files", files={"file": ("bench.jsonl", data)}, data={"purpose": "batch"}
        )
        file_id = uploaded.json()["id"]
        timings: dict[str, list[float]] = {"create": [], "retrieve": [], "list": []}
        started = time.perf_counter()
        await asyncio.gather(*(client_run(http, file_id, rounds, timings) for _ in range(clients)))
        return timings, time.perf_counter() - started


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", action="store_true", help="also run on PostgreSQL")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        backends: list[tuple[str, str | None]] = [("sqlite", None)]
        if args.postgres:
            backends.append(("postgresql", "fresh"))
        for name, database in backends:
            data_dir = Path(tmp) / name
            with fresh_database("postgresql", data_dir) if database else _none() as url_db:
                env = {"OVERNIGHT_DATA_DIR": str(data_dir)}
                if url_db:
                    env["OVERNIGHT_DATABASE_URL"] = url_db
                with api_server(env) as server:
                    timings, elapsed = asyncio.run(load(server.url, args.clients, args.rounds))
            calls = sum(len(v) for v in timings.values())
            for op, values in timings.items():
                rows.append((name, op, len(values), percentile(values, 50), percentile(values, 99)))
            rows.append((name, "all", calls, calls / elapsed, 0.0))
    print(f"{args.clients} concurrent clients, {args.rounds} rounds each")
    print(f"{'backend':<12}{'operation':<10}{'calls':>7}{'p50 ms':>9}{'p99 ms':>9}")
    for name, op, n, p50, p99 in rows:
        if op == "all":
            print(f"{name:<12}{'total':<10}{n:>7}{p50:>9.0f} req/s")
        else:
            print(f"{name:<12}{op:<10}{n:>7}{p50:>9.1f}{p99:>9.1f}")


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    main()
