"""Database and store sizes over many small batches, with retention and without.

Each round runs one small batch the whole way on the scripted path, in this process: an
input file, `create`, validation, the test suite's stand-in worker (tests/batch_sim.py), the
finalizer, with a webhook endpoint subscribed (one delivery a batch, marked delivered) and a
worker process "restarting" every `--restart-every` rounds (a `workers` row each). The
batch's files are then taken to their expiry (as if their 30 days had passed) and the API's
housekeeping steps run: `tidy` (expiry, leftover chunks) and, unless `--no-retention`, one
retention pass with every age 0 (orphans: 1 h). Every `--report-every` rounds it prints the
rows of each table retention prunes, the store's objects and bytes, and the database's size.

    .venv/bin/python bench/bench_retention.py [--batches 1000] [--lines 5]
        [--backend sqlite|postgresql] [--no-retention]
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, text, update

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.config import Settings
from app.core.states import DeliveryStatus
from app.db.models import (
    Batch,
    File,
    RegisteredWorker,
    ResultChunk,
    Shard,
    Upload,
    WebhookDelivery,
)
from app.db.session import session_scope
from app.services.housekeeping import tidy
from app.services.retention import retain
from app.storage import Storage, storage_of
from tests import batch_sim as sim
from tests.harness import fresh_database
from tests.retention_sim import ended_batch, subscribed_endpoint
from worker import registry

OWNER = "bench-retention"
PRUNED_TABLES = (Shard, ResultChunk, WebhookDelivery, RegisteredWorker, Upload)


def one_batch(settings: Settings, lines: int) -> None:
    batch_id = ended_batch(settings, lines)
    batch = sim.load_batch(settings, batch_id)
    files = [batch.input_file_id, batch.output_file_id, batch.error_file_id]
    now = time.time()
    with session_scope(settings) as session:
        session.execute(update(File).where(File.id.in_(files)).values(expires_at=int(now)))
        session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.status == DeliveryStatus.PENDING)
            .values(status=DeliveryStatus.DELIVERED, delivered_at=now)
        )


def restart_worker(settings: Settings, n: int) -> None:
    with session_scope(settings) as session:
        registry.loading(session, f"bench-worker-{n}", sim.MODEL, time.time())
        registry.stopped(session, f"bench-worker-{n}")


def sizes(settings: Settings, storage: Storage) -> dict[str, Any]:
    with session_scope(settings) as session:
        found: dict[str, Any] = {
            t.__tablename__: session.scalar(select(func.count()).select_from(t))
            for t in (Batch, *PRUNED_TABLES)
        }
        found["files(live)"] = session.scalar(select(func.count()).where(File.storage_key != ""))
        found["db_bytes"] = database_bytes(session, settings)
    keys = [o.key for folder in ("batches/", "files/", "uploads/") for o in storage.scan(folder)]
    found["objects"] = len(keys)
    found["object_bytes"] = sum(storage.size(k) for k in keys)
    return found


def database_bytes(session: Any, settings: Settings) -> int:
    if session.get_bind().dialect.name == "postgresql":
        return int(session.scalar(text("SELECT pg_database_size(current_database())")))
    db = Path(settings.sqlalchemy_url.removeprefix("sqlite:///"))
    return sum(p.stat().st_size for p in db.parent.glob(db.name + "*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=5)
    parser.add_argument("--backend", choices=["sqlite", "postgresql"], default="sqlite")
    parser.add_argument("--no-retention", action="store_true")
    parser.add_argument("--restart-every", type=int, default=10)
    parser.add_argument("--report-every", type=int, default=100)
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory() as tmp,
        fresh_database(args.backend, Path(tmp), migrated=True) as url,
    ):
        settings = Settings(
            data_dir=Path(tmp),
            database_url=url,
            retention_batch_rows_seconds=0,
            retention_deliveries_seconds=0,
            retention_workers_seconds=0,
            retention_files_seconds=0,
            served_model_memory_seconds=0,
            _env_file=None,  # type: ignore[call-arg]
        )
        storage = storage_of(settings)
        subscribed_endpoint(settings)
        started = time.monotonic()
        for n in range(1, args.batches + 1):
            one_batch(settings, args.lines)
            if n % args.restart_every == 0:
                restart_worker(settings, n)
            tidy(settings, OWNER)
            if not args.no_retention:
                retain(settings, OWNER)
            if n % args.report_every == 0:
                seconds = time.monotonic() - started
                print(f"{n:5d} batches {seconds:6.0f} s  {sizes(settings, storage)}", flush=True)


if __name__ == "__main__":
    main()
