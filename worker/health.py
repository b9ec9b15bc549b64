"""What the worker is doing, for a supervisor: its state, logged and kept in a health file.

The workers table cannot say `waiting_for_database` while the database is away, so the
state lives in a small JSON file (`--health-file`) that a probe can read without the
database: `{"worker_id": …, "pid": …, "state": …, "since": …, "detail": …}`. It is replaced
atomically, and written and logged only when the state changes, never once per retry.
"""

import json
import logging
import os
import time
from enum import StrEnum
from pathlib import Path

log = logging.getLogger("overnight.worker")


class HealthState(StrEnum):
    STARTING = "starting"  # loading the engine or preparing the database
    WAITING_FOR_DATABASE = "waiting_for_database"  # engine kept; no shard held
    READY = "ready"  # claiming and running shards
    DRAINING = "draining"  # told to stop: finishing in-flight requests, releasing leases
    STOPPED = "stopped"


class Health:
    def __init__(self, worker_id: str, path: str | Path | None = None) -> None:
        self.worker_id = worker_id
        self.path = Path(path) if path else None
        self.state = HealthState.STARTING
        self.since = time.time()
        self._write("")

    def set(self, state: HealthState, detail: str = "") -> None:
        if state is self.state:
            return
        log.info("worker %s: %s%s", self.worker_id, state, f" ({detail})" if detail else "")
        self.state, self.since = state, time.time()
        self._write(detail)

    def _write(self, detail: str) -> None:
        if self.path is None:
            return
        record = {
            "worker_id": self.worker_id,
            "pid": os.getpid(),
            "state": str(self.state),
            "since": self.since,
            "detail": detail,
        }
        temporary = self.path.with_name(self.path.name + ".tmp")
        temporary.write_text(json.dumps(record) + "\n")
        os.replace(temporary, self.path)
