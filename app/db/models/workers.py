"""The processes: registered workers and the steps one process does at a time."""

from typing import Any

from sqlalchemy import JSON, Float, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from app.db.models.base import Base


class SingletonLease(Base):
    """A step one process does at a time, and who does it (`app.services.singleton_lease`)."""

    __tablename__ = "singleton_leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    owner: Mapped[str | None] = mapped_column(String(128))
    expires_at: Mapped[float] = mapped_column(Float)


class RegisteredWorker(Base):
    """A worker process as the registry records it, for the dashboard and lease decisions."""

    __tablename__ = "workers"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(256))
    pid: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(256))
    started_at: Mapped[float] = mapped_column(Float)
    heartbeat_at: Mapped[float] = mapped_column(Float)
    current_shard_id: Mapped[int | None] = mapped_column(Integer)
    tokens_per_second: Mapped[float] = mapped_column(Float, default=0.0)
    stopped_at: Mapped[float | None] = mapped_column(Float)
    # None while the engine loads: the row is written before the engine starts.
    ready_at: Mapped[float | None] = mapped_column(Float)
    # What the engine runs with (`worker.engine.configuration_of`), for the dashboard.
    engine_configuration: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The engine scheduler's gauges at the last heartbeat (vLLM's own stats).
    engine_running: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    engine_waiting: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    kv_cache_usage: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
