"""The batch-level lease that validation and finalization run under.

Whoever moves a batch through a long step (reading its input, writing its
output) holds `batches.lease_owner` with a fresh `lease_epoch` and renews
`heartbeat_at`. A holder that dies stops renewing; after `lease_seconds` anyone
may take the batch over, and every write of the old holder is refused because
its epoch is no longer the batch's. The lease follows the rule of every lease
(`app.services.lease`): stamped, and judged, by the database's clock.

A step that raises gives the lease up with a backoff of the batch's own (`fail`): it is not
tried again before `step_retry_at`, twice as long after each failure in a row, so a batch
that keeps failing costs one try per backoff and never holds up the others.
"""

import time

from sqlalchemy import ColumnElement, or_, select, update
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import BatchLease
from app.core.states import BatchStatus
from app.db.clock import db_now
from app.db.models import Batch
from app.db.session import session_scope
from app.services import lease as leases


def lease_is_free(settings: Settings) -> ColumnElement[bool]:
    """SQL condition: nobody holds the batch's lease, or its holder stopped renewing it."""
    lapsed = leases.lapsed(Batch.heartbeat_at, settings.lease_seconds)
    return or_(Batch.lease_owner.is_(None), lapsed)


# A failing step's first wait and its longest, doubling in between.
STEP_RETRY_SECONDS = (5.0, 3600.0)


def step_due() -> ColumnElement[bool]:
    """SQL condition: the batch's step has not failed, or its backoff is over."""
    return or_(Batch.step_retry_at.is_(None), Batch.step_retry_at <= db_now())


def retry_delay(failures: int) -> float:
    """The backoff after `failures` failures in a row."""
    first, most = STEP_RETRY_SECONDS
    return min(first * 2 ** (failures - 1), most)


def take(
    session: Session, batch_id: str, seen_epoch: int, owner: str, *still: ColumnElement[bool]
) -> BatchLease | None:
    """Takes the lease if its epoch is still `seen_epoch` (compare-and-set) and the batch
    still meets the conditions `still` it was chosen by."""
    result = session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.lease_epoch == seen_epoch, *still)
        .values(lease_owner=owner, lease_epoch=seen_epoch + 1, heartbeat_at=leases.stamp())
        .execution_options(synchronize_session=False)
    )
    return BatchLease(batch_id, owner, seen_epoch + 1) if _rowcount(result) == 1 else None


def renew(settings: Settings, lease: BatchLease, *statuses: BatchStatus) -> bool:
    """Renews the heartbeat; False if the lease was lost or the status left `statuses`."""
    with session_scope(settings) as session:
        condition = [Batch.id == lease.batch_id, held(lease)]
        if statuses:
            condition.append(Batch.status.in_(statuses))
        result = session.execute(
            update(Batch)
            .where(*condition)
            .values(heartbeat_at=leases.stamp())
            .execution_options(synchronize_session=False)
        )
        return _rowcount(result) == 1


def release(settings: Settings, lease: BatchLease) -> None:
    """Gives the lease up at once (if still held) so the next step need not wait for expiry."""
    with session_scope(settings) as session:
        session.execute(
            update(Batch)
            .where(Batch.id == lease.batch_id, held(lease))
            .values(lease_owner=None, heartbeat_at=None)
            .execution_options(synchronize_session=False)
        )


def fail(settings: Settings, lease: BatchLease) -> float | None:
    """Gives the lease up after the step raised; returns the batch's backoff (None if the
    lease was lost meanwhile)."""
    condition = (Batch.id == lease.batch_id, held(lease))
    with session_scope(settings) as session:
        failures = session.scalar(select(Batch.step_failures).where(*condition).with_for_update())
        if failures is None:
            return None
        delay = retry_delay(failures + 1)
        session.execute(
            update(Batch)
            .where(*condition)
            .values(
                lease_owner=None,
                heartbeat_at=None,
                step_failures=failures + 1,
                step_retry_at=leases.stamp(delay),
            )
            .execution_options(synchronize_session=False)
        )
    return delay


def held(lease: BatchLease) -> ColumnElement[bool]:
    return leases.held(Batch.lease_owner, lease.owner, Batch.lease_epoch, lease.epoch)


def _rowcount(result: object) -> int:
    count: int = getattr(result, "rowcount", 0)
    return count


class Heartbeat:
    """Renews a lease while a long step runs, at most every third of `lease_seconds`."""

    def __init__(self, settings: Settings, lease: BatchLease, *statuses: BatchStatus) -> None:
        self.settings = settings
        self.lease = lease
        self.statuses = statuses
        self._next = time.monotonic() + settings.lease_seconds / 3

    def beat(self) -> bool:
        """False once the lease is lost (or the batch left `statuses`): stop and write nothing."""
        if time.monotonic() < self._next:
            return True
        self._next = time.monotonic() + self.settings.lease_seconds / 3
        return renew(self.settings, self.lease, *self.statuses)
