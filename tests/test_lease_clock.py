"""Every lease, lapse and expiry is judged by the database's clock (design §4.7).

A host whose clock runs a minute ahead, beside one whose clock is right, takes no live shard,
no batch step, not the planner's turn and no delivery; one a minute behind takes a lease whose
holder really stopped once its TTL has passed on the database's clock, and sees its batch
expire. The skew is injected from outside: `time.time` runs off by a minute while the
skewed host's code runs (the product must not read it for these decisions).
"""

import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TypeVar

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import DBAPIError

from app.config import Settings
from app.core.leases import ShardLease
from app.core.states import BatchStatus, DeliveryStatus, ShardOutcome, ShardStatus, WebhookEventType
from app.db.clock import read_db_now
from app.db.models import Batch, Shard, WebhookDelivery, WebhookEndpoint
from app.db.session import session_factory, session_scope
from app.ids import new_id
from app.services import schedule, singleton_lease, webhook_delivery
from app.services.auth import ensure_project
from app.services.housekeeping import PLANNER
from app.services.lease import end_if_left_idle
from app.services.steps import batch_lease, validation
from app.services.steps.finalization import finalize_ready_batches
from app.services.webhook_outbox import event_body, new_delivery, new_event_id
from app.services.webhook_senders import Room
from tests.batch_sim import store_input_file
from tests.fake_engine import MODEL
from worker import claim

SKEW = 60.0
SHORT_LEASE = 1.0
T = TypeVar("T")
Skew = Callable[[float], AbstractContextManager[None]]


@pytest.fixture
def skewed(monkeypatch: pytest.MonkeyPatch) -> Skew:
    """`with skewed(seconds):` runs its body on a host whose clock is `seconds` off."""
    real = time.time

    @contextmanager
    def off_by(seconds: float) -> Iterator[None]:
        with monkeypatch.context() as patch:
            patch.setattr(time, "time", lambda: real() + seconds)
            yield

    return off_by


def _short(settings: Settings) -> Settings:
    return settings.model_copy(update={"lease_seconds": SHORT_LEASE})


def _db_now(settings: Settings) -> float:
    with session_scope(settings) as session:
        return read_db_now(session)


def _after_db_time(settings: Settings, seconds: float) -> None:
    """Waits until `seconds` more have passed on the database's clock."""
    until = _db_now(settings) + seconds
    deadline = time.monotonic() + 60
    while _db_now(settings) <= until:
        assert time.monotonic() < deadline, "the database's clock does not move"
        time.sleep(0.1)


def _batch(settings: Settings, status: BatchStatus) -> str:
    """A batch of one one-line shard, expiring a day from the database's now."""
    with session_scope(settings) as session:
        project_id = ensure_project(session, "clocks").id
    file_id = store_input_file(settings, b'{"custom_id": "a"}\n', project_id)
    now = _db_now(settings)
    with session_scope(settings) as session:
        batch = Batch(
            id=new_id("batch_"),
            project_id=project_id,
            endpoint="/v1/chat/completions",
            input_file_id=file_id,
            model=MODEL,
            completion_window="24h",
            status=status,
            created_at=int(now),
            expires_at=int(now + 86400),
            total=1,
        )
        session.add(batch)
        session.flush()
        schedule.admit(session, batch)
        session.add(
            Shard(batch_id=batch.id, index=0, first_line=1, line_count=1, byte_start=0, byte_end=18)
        )
        return batch.id


def _claim(settings: Settings, owner: str) -> ShardLease | None:
    with session_scope(settings) as session:
        return claim.claim_shard(session, owner, [MODEL], settings.lease_seconds)


def _renews(settings: Settings, lease: ShardLease) -> bool:
    with session_scope(settings) as session:
        return claim.checkpoint(session, lease) is not None


def _shard(settings: Settings, batch_id: str) -> Shard:
    with session_scope(settings) as session:
        shard = session.scalar(select(Shard).where(Shard.batch_id == batch_id))
        assert shard is not None
        return shard


def _eventually(attempt: Callable[[], T | None]) -> T:
    """`attempt`'s first result that is not None, trying for half a minute: far longer than
    the lapse takes, and short of `SKEW`, so a lease judged by a slow host's clock stays."""
    deadline = time.monotonic() + SKEW / 2
    while (result := attempt()) is None:
        assert time.monotonic() < deadline, "the lapsed lease was never taken"
        time.sleep(0.2)
    return result


def test_a_worker_a_minute_ahead_takes_no_live_shard(settings: Settings, skewed: Skew) -> None:
    batch_id = _batch(settings, BatchStatus.IN_PROGRESS)
    held = _claim(settings, "right")
    assert held is not None
    with skewed(SKEW):
        assert _claim(settings, "ahead") is None
    assert _renews(settings, held), "the holder lost its lease to a fast clock"
    assert _shard(settings, batch_id).lease_owner == "right"


def test_a_stopped_holders_shard_is_taken_after_the_ttl_by_a_slow_clock(
    settings: Settings, skewed: Skew
) -> None:
    settings = _short(settings)
    _batch(settings, BatchStatus.IN_PROGRESS)
    stopped = _claim(settings, "stopped")
    assert stopped is not None
    _after_db_time(settings, SHORT_LEASE)
    with skewed(-SKEW):
        taken = _eventually(lambda: _claim(settings, "behind"))
    assert taken.shard_id == stopped.shard_id and taken.epoch == stopped.epoch + 1
    assert not _renews(settings, stopped), "the stopped holder's late write was accepted"


def test_a_slow_clock_sees_its_batch_expire(settings: Settings, skewed: Skew) -> None:
    batch_id = _batch(settings, BatchStatus.IN_PROGRESS)
    with skewed(-SKEW):
        held = _claim(settings, "behind")
        assert held is not None
        # The window ends once the shard is held (a batch made to expire 2 s after its
        # creation had expired before a busy machine claimed it).
        ends = int(_db_now(settings))
        with session_scope(settings) as session:
            session.execute(update(Batch).where(Batch.id == batch_id).values(expires_at=ends))
        _after_db_time(settings, 1)
        with session_scope(settings) as session:
            state = claim.checkpoint(session, held)
        assert state is not None and state.should_stop() is ShardOutcome.EXPIRED
        assert _claim(settings, "behind-too") is None, "a shard of an expired batch was claimed"
    assert _shard(settings, batch_id).status is ShardStatus.RUNNING


def test_a_finalizer_a_minute_ahead_leaves_a_live_shard_alone(
    settings: Settings, skewed: Skew
) -> None:
    batch_id = _batch(settings, BatchStatus.IN_PROGRESS)
    held = _claim(settings, "right")
    assert held is not None
    with session_scope(settings) as session:
        batch = session.scalar(select(Batch).where(Batch.id == batch_id))
        assert batch is not None
        batch.status = BatchStatus.CANCELLING
    with skewed(SKEW):
        assert finalize_ready_batches(settings, "ahead") == 0
    assert _renews(settings, held), "the live shard was fenced by a fast finalizer"


def test_batch_step_leases_follow_the_database_clock(settings: Settings, skewed: Skew) -> None:
    settings = _short(settings)
    batch_id = _batch(settings, BatchStatus.VALIDATING)
    first = validation.claim_next(settings, "right")
    assert first is not None
    with skewed(SKEW):
        assert validation.claim_next(settings, "ahead") is None
    assert batch_lease.renew(settings, first[0]), "the step's lease was stolen"
    _after_db_time(settings, SHORT_LEASE)
    with skewed(-SKEW):
        taken = _eventually(lambda: validation.claim_next(settings, "behind"))
    assert taken[0].batch_id == batch_id and taken[0].epoch == first[0].epoch + 1
    assert not batch_lease.renew(settings, first[0])


def test_a_failed_finalization_is_not_retried_early_by_a_fast_clock(
    settings: Settings, skewed: Skew
) -> None:
    batch_id = _batch(settings, BatchStatus.CANCELLING)
    with session_scope(settings) as session:
        failed = batch_lease.take(session, batch_id, 0, "right")
    assert failed is not None
    delay = batch_lease.fail(settings, failed)
    assert delay is not None and delay < SKEW
    with skewed(SKEW):
        assert finalize_ready_batches(settings, "ahead") == 0, "retried before its backoff"
    with session_scope(settings) as session:
        assert session.scalar(select(Batch.status).where(Batch.id == batch_id)) == (
            BatchStatus.CANCELLING
        )


def test_the_planner_turn_follows_the_database_clock(settings: Settings, skewed: Skew) -> None:
    with session_scope(settings) as session:
        assert singleton_lease.hold(session, PLANNER, "right", SHORT_LEASE)
    with skewed(SKEW), session_scope(settings) as session:
        assert not singleton_lease.hold(session, PLANNER, "ahead", SHORT_LEASE)
    _after_db_time(settings, SHORT_LEASE)

    def take_behind() -> bool | None:
        with skewed(-SKEW), session_scope(settings) as session:
            return singleton_lease.hold(session, PLANNER, "behind", SHORT_LEASE) or None

    assert _eventually(take_behind)


def _delivery(settings: Settings) -> str:
    with session_scope(settings) as session:
        project_id = ensure_project(session, "clocks").id
        now = int(read_db_now(session))
        endpoint = WebhookEndpoint(
            id=new_id("we_"),
            project_id=project_id,
            name="receiver",
            url="http://127.0.0.1:9/hook",
            event_types=[str(WebhookEventType.BATCH_COMPLETED)],
            enabled=True,
            secret="whsec_" + "0" * 32,
            created_at=now,
            updated_at=now,
        )
        event_id = new_event_id()
        body = event_body(event_id, WebhookEventType.BATCH_COMPLETED, now, "batch_x")
        delivery = new_delivery(endpoint.id, event_id, WebhookEventType.BATCH_COMPLETED, body, now)
        session.add(endpoint)
        session.flush()
        session.add(delivery)
        return delivery.id


def _claim_deliveries(settings: Settings, owner: str) -> list[str]:
    room = Room(free=8, per_endpoint=8, in_flight=Counter())
    return [due.id for due in webhook_delivery.claim(settings, owner, room)]


def test_delivery_leases_follow_the_database_clock(settings: Settings, skewed: Skew) -> None:
    settings = settings.model_copy(update={"lease_seconds": 0.6, "webhook_timeout_seconds": 0.1})
    delivery_id = _delivery(settings)
    assert _claim_deliveries(settings, "right") == [delivery_id]
    with skewed(SKEW):
        assert _claim_deliveries(settings, "ahead") == [], "a live delivery lease was taken"
    _after_db_time(settings, 1.0)
    with skewed(-SKEW):
        taken = _eventually(lambda: _claim_deliveries(settings, "behind") or None)
    assert taken == [delivery_id]
    with session_scope(settings) as session:
        delivery = session.scalar(select(WebhookDelivery).where(WebhookDelivery.id == delivery_id))
        assert delivery is not None
        assert (delivery.lease_owner, delivery.attempts) == ("behind", 2)
        assert delivery.status == DeliveryStatus.PENDING


@pytest.mark.backends("postgresql")  # SQLite: one writer, whose lock every other one waits on
def test_a_holder_frozen_inside_its_checkpoint_loses_the_shard(settings: Settings) -> None:
    settings = _short(settings)
    _batch(settings, BatchStatus.IN_PROGRESS)
    frozen = _claim(settings, "frozen")
    assert frozen is not None
    with session_factory(settings.sqlalchemy_url)() as session:
        session.begin()
        end_if_left_idle(session, SHORT_LEASE)
        assert claim.checkpoint(session, frozen) is not None  # the shard's row stays locked
        taken = _eventually(lambda: _claim(settings, "other"))
        assert taken.epoch == frozen.epoch + 1
        with pytest.raises(DBAPIError):
            session.commit()
