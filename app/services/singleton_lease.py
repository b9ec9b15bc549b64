"""Work one process of the deployment does at a time (the planner's pass): a named row lease.

Every API replica runs the same housekeeping, so a step that must not run twice at once (two
planner passes would both write ETAs and fight over `urgent_deadline`) first takes the
row of `singleton_leases` named after it, in the same transaction as the work it guards. The
row's lock then serializes passes: on PostgreSQL a concurrent taker skips the locked row
(`SKIP LOCKED`) rather than wait; on SQLite every write transaction is `BEGIN IMMEDIATE`, so
the second pass starts after the first commits and sees its renewal. Between passes,
`expires_at` keeps the turn with its holder, so the other replicas skip without doing the
work; once the holder stops renewing (or releases it on shutdown), the next taker gets it.
Its expiry is stamped and judged by the database's clock (`app.services.lease`).
"""

from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from app.db import upsert
from app.db.models import SingletonLease
from app.services import lease as leases


def hold(session: Session, name: str, owner: str, seconds: float) -> bool:
    """Takes or renews the lease `name` for `seconds` if free or `owner`'s; False if not."""
    lease = select(
        SingletonLease.owner, leases.lapsed(SingletonLease.expires_at).label("lapsed")
    ).where(SingletonLease.name == name)
    # Looked at without a lock first: a replica that only finds the lease taken must not lock
    # its row even briefly, or the holder's own pass would skip it.
    seen = session.execute(lease).one_or_none()
    if seen is None:
        session.execute(
            upsert.insert(session, SingletonLease)
            .values(name=name, owner=None, expires_at=0.0)
            .on_conflict_do_nothing()
        )
    elif _taken(seen, owner):
        return False
    locked = session.execute(lease.with_for_update(skip_locked=True)).one_or_none()
    if locked is None or _taken(locked, owner):  # another pass runs now, or just took it
        return False
    session.execute(
        update(SingletonLease)
        .where(SingletonLease.name == name)
        .values(owner=owner, expires_at=leases.stamp(seconds))
    )
    return True


def _taken(row: Any, owner: str) -> bool:
    return row.owner not in (None, owner) and not row.lapsed


def release(session: Session, name: str, owner: str) -> None:
    """Gives the lease up (if `owner` still holds it): the next taker need not wait."""
    session.execute(
        update(SingletonLease)
        .where(SingletonLease.name == name, leases.held(SingletonLease.owner, owner))
        .values(owner=None, expires_at=0.0)
    )
