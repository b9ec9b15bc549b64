"""Faults at every named point of every write path (`tests/fault_points.POINTS`), on both
databases. Here the call raises there (a raise after a commit is its lost reply) and the same
process carries on; `test_fault_exits_batch.py` and `test_fault_exits_api.py` stop the process
there (`os._exit`, then a fresh process resumes). Either way the invariants hold at the end:
the batch completes with every custom_id once, counts equal to the files, no persisted result
run again, no recorded chunk deleted; no visible File whose bytes are missing or cut short,
and the client's retry gets a whole one.
"""

import time
from dataclasses import replace

import pytest

from app.config import Settings
from app.db.session import session_scope
from app.services.steps import chunk_cleanup
from tests.fake_engine import MODEL
from tests.fault_cases import (
    assert_invariants_hold_after_a_fault,
    deployment,
    ids,
    run_raising,
)
from tests.fault_pipeline import (
    LINES,
    Deployment,
    armed,
    assert_batch_intact,
    assert_no_violations,
    create_batch,
)
from tests.fault_points import POINTS, POINTS_BY_NAME, Action, Event, FaultPoint, Injector
from worker import claim, shard

__all__ = ["deployment"]


@pytest.mark.parametrize("point", POINTS, ids=ids(POINTS))
def test_the_invariants_hold_after_a_raise_at(deployment: Deployment, point: FaultPoint) -> None:
    assert_invariants_hold_after_a_fault(deployment, point, Action.RAISE)


# The checkpoint that records a chunk: a renewal before the first answers (a loaded machine
# makes one) records nothing, so losing its reply would leave no recorded chunk to delete.
_RECORD = POINTS_BY_NAME[f"checkpoint.record:{Event.COMMIT_AFTER}"]
LOST_CHECKPOINT_REPLY = replace(_RECORD, site=replace(_RECORD.site, writes="result_chunks"))


class TakeoverAtLostReply(Injector):
    """Issue 27 item 1: a checkpoint's commit goes through, its reply is lost, and before the
    holder retries, another worker takes the shard: one configured with a far shorter lease
    (or, before leases were judged by the database's clock, one whose clock ran ahead)."""

    def __init__(self, deployment: Deployment) -> None:
        super().__init__(LOST_CHECKPOINT_REPLY, Action.RAISE)
        self.settings = deployment.settings
        self.taken = False

    def fire(self, moment: Event) -> None:
        time.sleep(0.05)  # the short lease lapses
        with session_scope(self.settings) as session:
            taken = claim.claim_shard(session, "short-lease-worker", [MODEL], 0.01)
            self.taken = taken is not None
            if taken is not None:
                # The taker hands the shard back at once (as a stopped worker does), so the
                # batch goes on without waiting for the taker's lease to lapse.
                claim.checkpoint(session, taken, release=True)
        super().fire(moment)


def run_with_takeover(deployment: Deployment) -> tuple[str, list[str]]:
    """A one-shard batch, the reply to the checkpoint that records its first chunk lost and
    its lease taken meanwhile, run to its end."""
    batch_id, ids = create_batch(deployment, slow_after=LINES // 2)
    with armed(deployment, TakeoverAtLostReply(deployment)) as injector:
        run_raising(deployment, injector, batch_id)
    assert injector.fired and injector.taken
    return batch_id, ids


@pytest.fixture
def one_shard(deployment: Deployment) -> Deployment:
    # A long lease: however loaded the machine, the holder never finds its own lease near its
    # end when the reply is lost (it would then let the shard go without retrying the record).
    update = {"shard_lines": 100, "lease_seconds": 30.0}
    return Deployment(deployment.settings.model_copy(update=update))


def test_a_lost_checkpoint_reply_and_a_takeover_keep_the_recorded_chunk(
    one_shard: Deployment,
) -> None:
    batch_id, ids = run_with_takeover(one_shard)
    assert_batch_intact(one_shard, batch_id, ids)


def test_the_harness_finds_issue_27_item_1(
    one_shard: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the chunk of a refused record deleted whatever the rows say (the code before the
    fix), the harness reports the recorded chunk it deleted."""

    def delete_regardless(_settings: Settings, storage: object, lease: object, seq: int) -> bool:
        storage.delete(lease.chunk_key(seq))  # type: ignore[attr-defined]
        return True

    monkeypatch.setattr(shard, "delete_unrecorded", delete_regardless)
    assert shard.delete_unrecorded is not chunk_cleanup.delete_unrecorded
    run_with_takeover(one_shard)
    with pytest.raises(AssertionError, match="recorded chunk of an open batch deleted"):
        assert_no_violations(one_shard)
