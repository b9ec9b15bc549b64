"""Faults at every named point of every write path (`tests/fault_points.POINTS`), on both
databases: the process stops there (`os._exit`, then a fresh process resumes), or the call
raises there (a raise after a commit is its lost reply) and the same process carries on.
Either way the invariants hold at the end: the batch completes with every custom_id once,
counts equal to the files, no persisted result run again, no recorded chunk deleted; no
visible File whose bytes are missing or cut short, and the client's retry gets a whole one.
"""

import asyncio
import subprocess
import sys
import time

import pytest

from app.config import Settings
from app.db.session import session_scope
from app.services.steps import batch_lease, chunk_cleanup
from tests.fake_engine import MODEL
from tests.fault_api import api, assert_api_intact, send_through_faults
from tests.fault_pipeline import (
    LINES,
    Deployment,
    armed,
    assert_batch_intact,
    assert_no_violations,
    create_batch,
    drive,
    fault_settings,
)
from tests.fault_points import (
    FAULT_EXIT,
    POINTS,
    POINTS_BY_NAME,
    Action,
    Event,
    FaultPoint,
    Injector,
    Path,
)
from tests.harness import REPO
from worker import claim, shard

RECOVERY_SECONDS = 120.0


@pytest.fixture
def deployment(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    # A failed batch step waits a moment, not the production backoff's 5 s.
    monkeypatch.setattr(batch_lease, "STEP_RETRY_SECONDS", (0.2, 1.0))
    return Deployment(fault_settings(settings.data_dir, settings.sqlalchemy_url))


def stop_at(deployment: Deployment, point: FaultPoint, batch_id: str | None) -> int:
    """Runs the point's path in a process of its own, armed to stop there; its exit status."""
    settings = deployment.settings
    command = [
        sys.executable,
        "-m",
        "tests.fault_victim",
        f"--data-dir={settings.data_dir}",
        f"--database-url={settings.database_url}",
        f"--point={point.name}",
    ]
    if batch_id is not None:
        command.append(f"--batch-id={batch_id}")
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert done.returncode in (0, FAULT_EXIT), done.stderr[-4000:]
    return done.returncode


def resume(deployment: Deployment, batch_id: str) -> None:
    """A fresh, unfaulted deployment runs the batch to its end."""
    asyncio.run(drive(deployment, deployment.storage(), batch_id, RECOVERY_SECONDS))


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("point", POINTS, ids=[p.name for p in POINTS])
def test_the_invariants_hold_after_a_fault_at(
    deployment: Deployment, point: FaultPoint, action: Action
) -> None:
    batch_id, ids = create_batch(deployment) if point.site.path is Path.BATCH else (None, [])
    if action is Action.EXIT:
        assert stop_at(deployment, point, batch_id) == FAULT_EXIT, "the point was never reached"
    else:
        with armed(deployment, Injector(point, Action.RAISE)) as injector:
            run_raising(deployment, injector, batch_id)
        assert injector.fired, "the point was never reached"
    if batch_id is None:
        storage = deployment.storage()
        assert_api_intact(deployment.settings, storage, point.site.path)
        assert_no_violations(deployment)
        return
    resume(deployment, batch_id)
    assert_batch_intact(deployment, batch_id, ids)


def run_raising(deployment: Deployment, injector: Injector, batch_id: str | None) -> None:
    """The path, in this process, through the fault; the batch's run goes on to its end."""
    storage = deployment.storage(injector)
    if batch_id is not None:
        asyncio.run(drive(deployment, storage, batch_id, RECOVERY_SECONDS))
        return
    with api(deployment.settings, storage) as client:
        send_through_faults(client, injector.point.site.path)


LOST_CHECKPOINT_REPLY = POINTS_BY_NAME[f"checkpoint.record:{Event.COMMIT_AFTER}"]


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
            self.taken = claim.claim_shard(session, "short-lease-worker", [MODEL], 0.01) is not None
        super().fire(moment)


def run_with_takeover(deployment: Deployment) -> tuple[str, list[str]]:
    """A one-shard batch, its first checkpoint's reply lost and its lease taken meanwhile,
    run to its end."""
    batch_id, ids = create_batch(deployment, slow_after=LINES // 2)
    with armed(deployment, TakeoverAtLostReply(deployment)) as injector:
        run_raising(deployment, injector, batch_id)
    assert injector.fired and injector.taken
    return batch_id, ids


@pytest.fixture
def one_shard(deployment: Deployment) -> Deployment:
    return Deployment(deployment.settings.model_copy(update={"shard_lines": 100}))


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
