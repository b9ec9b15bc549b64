"""Liveness and readiness probes (no authentication)."""

import logging
import secrets
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import SettingsDep
from app.config import Settings
from app.db.session import session_factory
from app.storage import storage_of
from app.storage.base import put

log = logging.getLogger("overnight.health")

router = APIRouter(tags=["health"])


@router.get("/healthz", operation_id="getHealth")
def healthz() -> dict[str, str]:
    """The process is up and serving HTTP."""
    return {"status": "ok"}


def _check_database(settings: Settings) -> None:
    with session_factory(settings.sqlalchemy_url)() as session:
        session.execute(text("SELECT 1"))
        session.rollback()


def _check_storage(settings: Settings) -> None:
    storage = storage_of(settings)
    key = f"health/probe-{secrets.token_hex(8)}"
    put(storage, key, [b"ok"])
    try:
        if b"".join(storage.read(key)) != b"ok":
            raise RuntimeError("storage returned other bytes than were written")
    finally:
        storage.delete(key)


@router.get("/readyz", operation_id="getReadiness")
def readyz(settings: SettingsDep) -> JSONResponse:
    """The database answers and storage can write, read and delete an object."""
    checks: dict[str, Any] = {}
    for name, check in (("database", _check_database), ("storage", _check_storage)):
        try:
            check(settings)
            checks[name] = "ok"
        except Exception as exc:
            # The details (paths, hosts) go to the log, not to an unauthenticated caller.
            log.warning("readiness check %s failed", name, exc_info=True)
            checks[name] = f"error: {type(exc).__name__}"
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks},
        status_code=200 if ready else 503,
    )
