"""The `workers` table: who runs, on which host, serving which model, how fast, and what its
engine's scheduler holds (running and waiting requests, KV-cache use) at each heartbeat.

A worker's row is written before its engine starts (`ready_at` unset: loading), kept fresh
while the engine loads, and marked ready once the engine serves.
"""

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.config import Settings
from app.db.models import RegisteredWorker
from app.db.session import session_scope
from worker.engine_gauges import EngineStats

log = logging.getLogger("overnight.worker")


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def register(
    session: Session, worker_id: str, model: str, configuration: dict[str, Any] | None = None
) -> None:
    """The worker's engine serves: it may take shards from now on."""
    now = time.time()
    session.merge(_row(worker_id, model, now, ready_at=now, configuration=configuration))


def loading(
    session: Session,
    worker_id: str,
    model: str,
    started_at: float,
    configuration: dict[str, Any] | None = None,
) -> None:
    """The worker's engine is starting (downloading, loading weights, compiling);
    `configuration`: what a switching worker keeps announcing while it loads."""
    session.merge(_row(worker_id, model, started_at, ready_at=None, configuration=configuration))


def _row(
    worker_id: str,
    model: str,
    started_at: float,
    ready_at: float | None,
    configuration: dict[str, Any] | None = None,
) -> RegisteredWorker:
    return RegisteredWorker(
        id=worker_id,
        host=socket.gethostname(),
        pid=os.getpid(),
        model=model,
        started_at=started_at,
        heartbeat_at=time.time(),
        current_shard_id=None,
        tokens_per_second=0.0,
        stopped_at=None,
        ready_at=ready_at,
        engine_configuration=configuration,
        engine_running=0,
        engine_waiting=0,
        kv_cache_usage=0.0,
    )


def heartbeat(
    session: Session,
    worker_id: str,
    current_shard_id: int | None,
    tokens_per_second: float,
    engine: EngineStats | None = None,
    configuration: dict[str, Any] | None = None,
) -> None:
    """Renew the row; `configuration`: the engine's, when its announcement changed."""
    engine = engine or EngineStats()
    changed = {} if configuration is None else {"engine_configuration": configuration}
    _update(
        session,
        worker_id,
        current_shard_id,
        tokens_per_second,
        engine,
        heartbeat_at=time.time(),
        **changed,
    )


def stopped(session: Session, worker_id: str) -> None:
    _update(session, worker_id, None, 0.0, EngineStats(), stopped_at=time.time())


def _update(
    session: Session,
    worker_id: str,
    current_shard_id: int | None,
    tokens_per_second: float,
    engine: EngineStats,
    **stamp: object,
) -> None:
    session.execute(
        update(RegisteredWorker)
        .where(RegisteredWorker.id == worker_id)
        .values(
            current_shard_id=current_shard_id,
            tokens_per_second=tokens_per_second,
            engine_running=engine.running,
            engine_waiting=engine.waiting,
            kv_cache_usage=engine.kv_cache_usage,
            **stamp,
        )
    )


class LoadingBeat:
    """Keeps a `loading` row fresh from a thread while the engine starts.

    A thread, because loading an engine may block the event loop. Best effort: the database
    may not be reachable (or migrated) yet, and the worker must start anyway. If the block
    ends before `ready()`, the engine never came up and the row says stopped.
    """

    def __init__(
        self,
        settings: Settings,
        worker_id: str,
        model: str,
        every: float,
        configuration: dict[str, Any] | None = None,
    ) -> None:
        self.settings, self.worker_id, self.model, self.every = settings, worker_id, model, every
        self.configuration = configuration
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="loading-heartbeat", daemon=True)
        self._started = time.time()

    def __enter__(self) -> "LoadingBeat":
        self._thread.start()
        return self

    def ready(self) -> None:
        self._done.set()
        self._thread.join()

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._done.is_set():
            return
        self.ready()
        self._write(stopped)

    def _beat(self) -> None:
        while not self._done.is_set():
            self._write(loading, self.model, self._started, self.configuration)
            self._done.wait(self.every)

    def _write(self, action: Callable[..., None], *args: object) -> None:
        try:
            with session_scope(self.settings) as session:
                action(session, self.worker_id, *args)
        except Exception as exc:
            log.debug("could not record the loading worker %s: %s", self.worker_id, exc)
