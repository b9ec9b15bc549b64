"""Latency of the dashboard's live feeds and of `/metrics` on a busy deployment.

Fills a fresh database with many batches (shards, result chunks), files and workers,
starts `overnight api` on it, then times each polled endpoint. The dashboard polls every
1.5 s per open tab and Prometheus scrapes `/metrics`: both must stay cheap as data grows.

    .venv/bin/python bench/bench_dashboard.py [--batches 2000] [--requests 50] [--postgres]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from server import api_server

from app.config import Settings
from app.db.models import Batch, File, Project, RegisteredWorker, ResultChunk, Shard
from app.db.session import session_scope, upgrade
from tests.harness import fresh_database

STATUSES = ["completed"] * 6 + ["in_progress"] * 3 + ["failed"]
SHARDS_PER_RUNNING_BATCH = 50
CHUNKS_PER_SHARD = 4
WORKERS = 64


def fill(settings: Settings, batches: int) -> str:
    """Returns the id of a running batch (for the batch page's feed)."""
    upgrade(settings.sqlalchemy_url)
    now = int(time.time())
    running_id = ""
    with session_scope(settings) as session:
        projects = [Project(id=f"proj_{i}", name=f"team-{i}", created_at=now) for i in range(20)]
        session.add_all(projects)
        session.flush()
        files = [
            File(
                id=f"file-{i}", project_id=projects[i % 20].id, filename=f"in-{i}.jsonl",
                purpose="batch", bytes=1000, sha256="0" * 64, storage_key=f"files/file-{i}",
                created_at=now, expires_at=None,
            )
            for i in range(batches)
        ]  # fmt: skip
        session.add_all(files)
        session.flush()
        for i in range(batches):
            status = STATUSES[i % len(STATUSES)]
            batch = Batch(
                id=f"batch_{i:08d}", project_id=projects[i % 20].id,
                endpoint="/v1/chat/completions", input_file_id=files[i].id, model="m",
                completion_window="24h", status=status, created_at=now - i,
                in_progress_at=now - i, expires_at=now + 86400,
                total=SHARDS_PER_RUNNING_BATCH * 100, completed=10, failed=1,
            )  # fmt: skip
            session.add(batch)
            if status != "in_progress":
                continue
            running_id = running_id or batch.id
            for s in range(SHARDS_PER_RUNNING_BATCH):
                shard = Shard(
                    batch_id=batch.id, index=s, first_line=s * 100 + 1, line_count=100,
                    byte_start=0, byte_end=1, status="running" if s < 4 else "pending",
                    completed=s % 100, failed=1, input_tokens=1000, output_tokens=500,
                )  # fmt: skip
                session.add(shard)
                session.flush()
                session.add_all(
                    ResultChunk(
                        shard_id=shard.id, epoch=1, sequence=c, storage_key=f"k/{shard.id}/{c}",
                        lines=10, created_at=now - 300 + c * 10 + s,
                    )
                    for c in range(CHUNKS_PER_SHARD)
                )  # fmt: skip
        session.add_all(
            RegisteredWorker(
                id=f"w-{i}", host="h", pid=i, model="m", started_at=now, heartbeat_at=now,
                current_shard_id=i + 1, tokens_per_second=100.0,
            )
            for i in range(WORKERS)
        )  # fmt: skip
    return running_id


def timings(url: str, n: int) -> tuple[float, float]:
    with httpx.Client(timeout=60) as http:
        assert http.get(url).status_code == 200, url
        samples = []
        for _ in range(n):
            started = time.perf_counter()
            http.get(url).raise_for_status()
            samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.99) - 1]


def run(backend: str, batches: int, requests: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, fresh_database(backend, Path(tmp)) as db_url:
        settings = Settings(data_dir=Path(tmp), database_url=db_url, _env_file=None)  # type: ignore[call-arg]
        started = time.perf_counter()
        running = fill(settings, batches)
        filled = time.perf_counter() - started
        env = {
            "OVERNIGHT_DATABASE_URL": db_url,
            "OVERNIGHT_DATA_DIR": tmp,
            "OVERNIGHT_LOG_LEVEL": "warning",
        }
        with api_server(env) as server:
            for path in (
                "/dashboard/api/batches",
                "/dashboard/api/batches?status=in_progress",
                f"/dashboard/api/batches/{running}",
                "/dashboard/api/workers",
                "/dashboard/api/files",
                "/metrics",
            ):
                p50, p99 = timings(server.url + path, requests)
                print(f"| {backend:<10} | {batches:>7} | {path:<42} | {p50:7.1f} | {p99:7.1f} |")
        print(f"(filled in {filled:.1f} s)", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--postgres", action="store_true", help="also on PostgreSQL")
    args = parser.parse_args()
    print(f"| backend    | batches | {'endpoint':<42} | p50 ms  | p99 ms  |")
    print(f"|------------|---------|{'-' * 44}|---------|---------|")
    for backend in ["sqlite", *(["postgresql"] if args.postgres else [])]:
        run(backend, args.batches, args.requests)


if __name__ == "__main__":
    main()
