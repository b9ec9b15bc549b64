"""Validation of a 50,000-line, ~200 MB chat batch file: wall time and memory growth.

Targets: <= 3 s and < 100 MB RSS growth. Runs the real validator in process on
SQLite (and on PostgreSQL with --postgres URL), with a file written to local storage.

    .venv/bin/python bench/bench_validation.py [--lines 50000] [--line-bytes 3960]
"""

import argparse
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import Settings
from app.db.session import session_factory, upgrade
from app.schemas.batches import CreateBatchRequest
from app.services import batches
from app.services.auth import DEFAULT_PROJECT, ensure_project
from app.services.files import create_file_from_storage, file_storage_key
from app.services.steps.validation import validate_pending
from app.storage import storage_for
from app.storage.base import put
from tests.harness import fresh_database

MODEL = "SmolLM2-135M-Instruct"


def lines(n: int, line_bytes: int) -> Iterator[bytes]:
    filler = "lorem ipsum dolor sit amet " * (line_bytes // 27 + 1)
    for i in range(n):
        body = {
            "model": MODEL,
            "max_tokens": 64,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": filler[: line_bytes - 200]},
            ],
        }
        request = {"custom_id": f"request-{i}", "method": "POST", "url": "/v1/chat/completions"}
        yield orjson.dumps({**request, "body": body}) + b"\n"


class RssSampler(threading.Thread):
    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(0.005)


def run(settings: Settings, n: int, line_bytes: int) -> dict[str, float]:
    upgrade(settings.sqlalchemy_url)
    storage = storage_for(str(settings.storage_dir))
    with session_factory(settings.sqlalchemy_url)() as session:
        project_id = ensure_project(session, DEFAULT_PROJECT).id
        session.commit()
        stored = put(storage, file_storage_key("file-bench"), lines(n, line_bytes))
        create_file_from_storage(
            session,
            project_id=project_id,
            filename="bench.jsonl",
            purpose="batch",
            stored=stored,
            expires_at=None,
            file_id="file-bench",
        )
        session.commit()
        params = CreateBatchRequest(
            input_file_id="file-bench", endpoint="/v1/chat/completions", completion_window="24h"
        )
        batch_id = batches.create_batch(session, settings, project_id, params).id
    sampler = RssSampler()
    before = sampler.peak
    sampler.start()
    started = time.perf_counter()
    assert validate_pending(settings, "bench") == 1
    elapsed = time.perf_counter() - started
    sampler.running = False
    sampler.join()
    with session_factory(settings.sqlalchemy_url)() as session:
        batch = batches.get_batch(session, project_id, batch_id)
    assert batch.status == "in_progress", batch.errors
    assert batch.request_counts.total == n
    return {
        "lines": n,
        "MB": stored.bytes / 1e6,
        "seconds": elapsed,
        "MB/s": stored.bytes / 1e6 / elapsed,
        "rss_growth_MB": (sampler.peak - before) / 1e6,
        "max_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--lines", type=int, default=50_000)
    parser.add_argument("--line-bytes", type=int, default=3960)
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="also run on a fresh PostgreSQL database (server from OVERNIGHT_TEST_POSTGRES_URL)",
    )
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp) / "sqlite", _env_file=None)  # type: ignore[call-arg]
        results.append(("sqlite", run(settings, args.lines, args.line_bytes)))
        if args.postgres:
            with fresh_database("postgresql", Path(tmp)) as url:
                pg = Settings(data_dir=Path(tmp) / "pg", database_url=url, _env_file=None)  # type: ignore[call-arg]
                results.append(("postgresql", run(pg, args.lines, args.line_bytes)))
    print(f"{'backend':<12}{'lines':>8}{'MB':>9}{'seconds':>9}{'MB/s':>8}{'RSS+ MB':>9}")
    for backend, r in results:
        print(
            f"{backend:<12}{r['lines']:>8,.0f}{r['MB']:>9.1f}{r['seconds']:>9.2f}"
            f"{r['MB/s']:>8.0f}{r['rss_growth_MB']:>9.1f}"
        )
    print("targets: <= 3 s, < 100 MB RSS growth")


if __name__ == "__main__":
    main()
