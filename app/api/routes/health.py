"""Liveness and readiness probes (no authentication)."""

import logging
import secrets
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.api.deps import AccessDep, SettingsDep
from app.config import Settings
from app.db.session import session_factory
from app.services.auth import Access
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


def _access(settings: Settings, access: Access) -> str:
    if not access.started_open:
        return "keys_required"
    try:
        with session_factory(settings.sqlalchemy_url)() as session:
            return access.describe(session, settings)
    except Exception:
        return "open"  # as last seen: the failed database check tells the rest


@router.get("/readyz", operation_id="getReadiness")
def readyz(settings: SettingsDep, access: AccessDep) -> JSONResponse:
    """The database answers and storage can write, read and delete an object.

    `access` says whether callers need a key (`keys_required`) or not (`open`)."""
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
        {
            "status": "ok" if ready else "unavailable",
            "access": _access(settings, access),
            "checks": checks,
        },
        status_code=200 if ready else 503,
    )
