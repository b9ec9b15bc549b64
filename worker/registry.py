"""The `workers` table: who runs, on which host, serving which model, how fast, and what its
engine's scheduler holds (running and waiting requests, KV-cache use) at each heartbeat."""

import os
import secrets
import socket
import time
from typing import Any

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.db.models import RegisteredWorker
from worker.engine import EngineStats


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def register(
    session: Session, worker_id: str, model: str, configuration: dict[str, Any] | None = None
) -> None:
    now = time.time()
    session.merge(
        RegisteredWorker(
            id=worker_id,
            host=socket.gethostname(),
            pid=os.getpid(),
            model=model,
            started_at=now,
            heartbeat_at=now,
            current_shard_id=None,
            tokens_per_second=0.0,
            stopped_at=None,
            engine_configuration=configuration,
            engine_running=0,
            engine_waiting=0,
            kv_cache_usage=0.0,
        )
    )


def heartbeat(
    session: Session,
    worker_id: str,
    current_shard_id: int | None,
    tokens_per_second: float,
    engine: EngineStats | None = None,
) -> None:
    engine = engine or EngineStats()
    session.execute(
        update(RegisteredWorker)
        .where(RegisteredWorker.id == worker_id)
        .values(
            heartbeat_at=time.time(),
            current_shard_id=current_shard_id,
            tokens_per_second=tokens_per_second,
            engine_running=engine.running,
            engine_waiting=engine.waiting,
            kv_cache_usage=engine.kv_cache_usage,
        )
    )


def stopped(session: Session, worker_id: str) -> None:
    session.execute(
        update(RegisteredWorker)
        .where(RegisteredWorker.id == worker_id)
        .values(
            stopped_at=time.time(),
            current_shard_id=None,
            tokens_per_second=0.0,
            engine_running=0,
            engine_waiting=0,
        )
    )
