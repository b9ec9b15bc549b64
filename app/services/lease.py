"""The one lease rule of every leased row: shards, batch steps, the planner's turn, deliveries.

A lease is judged by the database's clock (`app.db.clock`), never by the holder's or the
taker's: a host whose clock runs ahead must not take live leases, nor one behind keep
lapsed ones. Every leased row carries a stamp the database writes in the statement that
takes or renews the lease: either when its holder last renewed it (`heartbeat_at` of shards
and batches; the lease lasts `grace` seconds more) or when it runs out (`expires_at` of the
planner's lease, `lease_expires_at` of a delivery; `grace` 0). A lease has lapsed once its
stamp plus grace is behind the database's now.

Fencing: taking a lease names a new holder (its owner, and a bumped epoch where the row has
one); every later write of a holder names both and is refused once the row names another.

A holder frozen inside a transaction (SIGSTOP, a stalled VM) would keep its rows locked, and
takers skip locked rows: on PostgreSQL such a transaction ends once idle for the lease's
length (`end_if_left_idle`), so the lease can lapse and be taken as if the holder had died.
"""

from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import SQLCoreOperations

from app.db.clock import db_now

Seconds = float | ColumnElement[Any]
Column = SQLCoreOperations[Any]


def stamp(lasts: Seconds = 0.0) -> ColumnElement[float]:
    """What a taker or a renewer writes: the database's now, plus `lasts` for an expiry."""
    return db_now() + lasts


def lapsed(stamped: Column, grace: Seconds = 0.0) -> ColumnElement[bool]:
    """SQL condition: nobody holds the lease (never stamped), or its holder's ran out."""
    return or_(stamped.is_(None), stamped < db_now() - grace)


def live(stamped: Column, grace: Seconds = 0.0) -> ColumnElement[bool]:
    """SQL condition: the lease is held and has not run out."""
    return stamped >= db_now() - grace


def held(
    owner_column: Column,
    owner: str,
    epoch_column: Column | None = None,
    epoch: int | None = None,
) -> ColumnElement[bool]:
    """SQL condition, the fencing rule: the row still names this holder."""
    if epoch_column is None:
        return owner_column == owner
    return and_(owner_column == owner, epoch_column == epoch)


def end_if_left_idle(session: Session, seconds: float) -> None:
    """Has the database end this transaction if it waits on its client for `seconds`
    (PostgreSQL; SQLite has one writer on one host and no such setting)."""
    if session.get_bind().dialect.name == "postgresql":
        timeout = str(max(1, round(seconds * 1000)))
        session.execute(
            select(func.set_config("idle_in_transaction_session_timeout", timeout, True))
        )
