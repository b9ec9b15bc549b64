"""The process stops (`os._exit`) at every named point of validation, shards, checkpoints
and finalization, on both databases; a fresh process recovers and the invariants hold
(`tests/test_fault_points.py` says which).
Split from the raising cases only so that the suite's processes share them."""

import pytest

from tests.fault_cases import BATCH_POINTS, assert_invariants_hold_after_a_fault, deployment, ids
from tests.fault_pipeline import Deployment
from tests.fault_points import Action, FaultPoint

__all__ = ["deployment"]


@pytest.mark.parametrize("point", BATCH_POINTS, ids=ids(BATCH_POINTS))
def test_the_invariants_hold_after_an_exit_at(deployment: Deployment, point: FaultPoint) -> None:
    assert_invariants_hold_after_a_fault(deployment, point, Action.EXIT)
