"""The deployment's figures, read in one transaction and shared by whoever asks at once.

`/metrics`, the dashboard's overview and `GET /v1/admin/stats` (`overnight status`) read
them here. A read takes a read-only transaction (on SQLite it never waits for the write
lock), and callers that arrive while a read is under way share its result instead of
starting another, so a scraper and a dozen open dashboards cost one read at a time.
"""

import threading
import time
from dataclasses import dataclass

from sqlalchemy.orm import Session

from app.config import Settings
from app.db.session import read_scope
from app.schemas.stats import ModelStats, ProjectTokensToday, StatsObject
from app.services import monitoring, online_usage
from app.services.fleet import Fleet, day_start, fleet


@dataclass(frozen=True)
class Stats:
    taken_at: float
    totals: monitoring.Totals
    workers: list[monitoring.WorkerView]
    running: list[monitoring.BatchView]
    durations: dict[str, monitoring.Durations]
    waits: dict[str, monitoring.Durations]
    online: list[online_usage.UsageRow]
    fleet: Fleet


def read_stats(session: Session, lease_seconds: float) -> Stats:
    now = time.time()
    totals = monitoring.totals(session)
    workers = monitoring.list_workers(session, lease_seconds)
    return Stats(
        taken_at=now,
        totals=totals,
        workers=workers,
        running=monitoring.running_batches(session),
        durations=monitoring.batch_durations(session),
        waits=monitoring.queue_waits(session),
        online=online_usage.totals(session),
        fleet=fleet(session, totals, workers, day_start(now)),
    )


def stats_object(stats: Stats) -> StatsObject:
    f = stats.fleet
    return StatsObject(
        taken_at=stats.taken_at,
        batches=dict(stats.totals.batches_by_status),
        workers=dict(f.workers),
        tokens_per_second=f.tokens_per_second,
        models=[ModelStats(**vars(q)) for q in f.models],
        tokens_today=[ProjectTokensToday(**vars(p)) for p in f.tokens_today],
    )


class _Read:
    """One read under way: its result, once done, for every caller that waited for it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.stats: Stats | None = None


class StatsReader:
    """One read at a time per process; who asks during a read gets that read's figures."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._under_way: _Read | None = None

    def get(self) -> Stats:
        with self._lock:
            joined, read = self._under_way, _Read()
            if joined is None:
                self._under_way = read
        if joined is not None:
            joined.done.wait()
            if joined.stats is not None:
                return joined.stats
            return self._read()  # the read we waited for failed: this caller sees why
        try:
            read.stats = self._read()
            return read.stats
        finally:
            with self._lock:
                self._under_way = None
            read.done.set()

    def _read(self) -> Stats:
        with read_scope(self.settings) as session:
            return read_stats(session, self.settings.lease_seconds)
