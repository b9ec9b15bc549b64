"""The `workers` table: who runs, on which host, serving which model, how fast."""

import os
import secrets
import socket
import time

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.db.models import RegisteredWorker


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def register(session: Session, worker_id: str, model: str) -> None:
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
        )
    )


def heartbeat(
    session: Session, worker_id: str, current_shard_id: int | None, tokens_per_second: float
) -> None:
    session.execute(
        update(RegisteredWorker)
        .where(RegisteredWorker.id == worker_id)
        .values(
            heartbeat_at=time.time(),
            current_shard_id=current_shard_id,
            tokens_per_second=tokens_per_second,
        )
    )


def stopped(session: Session, worker_id: str) -> None:
    session.execute(
        update(RegisteredWorker)
        .where(RegisteredWorker.id == worker_id)
        .values(stopped_at=time.time(), current_shard_id=None, tokens_per_second=0.0)
    )
