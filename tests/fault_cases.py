"""One fault case, shared by the fault-point test files: arm the point, run its path
through the fault (in a process of its own that stops there, or in this one, raising there),
recover, and check the invariants. The cases are split over several files only so that
the suite's processes share them out."""

import asyncio

import pytest

from app.config import Settings
from app.services.steps import batch_lease
from tests.fault_api import api, assert_api_intact, send_through_faults
from tests.fault_pipeline import (
    Deployment,
    armed,
    assert_batch_intact,
    assert_no_violations,
    create_batch,
    drive,
    fault_settings,
)
from tests.fault_points import FAULT_EXIT, POINTS, Action, FaultPoint, Injector, Path
from tests.fault_victim import run_victim

RECOVERY_SECONDS = 120.0
BATCH_POINTS = [p for p in POINTS if p.site.path is Path.BATCH]
API_POINTS = [p for p in POINTS if p.site.path is not Path.BATCH]


def ids(points: list[FaultPoint]) -> list[str]:
    return [p.name for p in points]


@pytest.fixture
def deployment(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    # A failed batch step waits a moment, not the production backoff's 5 s.
    monkeypatch.setattr(batch_lease, "STEP_RETRY_SECONDS", (0.2, 1.0))
    return Deployment(fault_settings(settings.data_dir, settings.sqlalchemy_url))


def assert_invariants_hold_after_a_fault(
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


def stop_at(deployment: Deployment, point: FaultPoint, batch_id: str | None) -> int:
    """Runs the point's path in a process of its own, armed to stop there; its exit status."""
    status, output = run_victim(deployment, point, batch_id)
    assert status in (0, FAULT_EXIT), f"the victim ended with {status}:\n{output[-4000:]}"
    return status


def resume(deployment: Deployment, batch_id: str) -> None:
    """A fresh, unfaulted deployment runs the batch to its end."""
    asyncio.run(drive(deployment, deployment.storage(), batch_id, RECOVERY_SECONDS))


def run_raising(deployment: Deployment, injector: Injector, batch_id: str | None) -> None:
    """The path, in this process, through the fault; the batch's run goes on to its end."""
    storage = deployment.storage(injector)
    if batch_id is not None:
        asyncio.run(drive(deployment, storage, batch_id, RECOVERY_SECONDS))
        return
    with api(deployment.settings, storage) as client:
        send_through_faults(client, injector.point.site.path)
