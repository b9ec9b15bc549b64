"""When a switching worker (`overnight worker --models`) leaves the model it holds: the rule
the worker follows, and the wait the planner expects before it serves a model it does not hold.

A model that still has work is held for its residency: at least `min_residency`, and four
times what loading the next model costs, so that switching takes at most a fifth of the time.
An idle model is left at once.
"""

from dataclasses import dataclass
from typing import Any

# Switching may take at most this share of a worker's time.
SWITCH_SHARE = 0.2


@dataclass(frozen=True)
class SwitchRule:
    min_residency: float

    def residency(self, switch_seconds: float) -> float:
        """How long a model is held at least while it still has work."""
        return max(self.min_residency, switch_seconds * (1 - SWITCH_SHARE) / SWITCH_SHARE)

    def should_leave(
        self,
        held: str,
        queued: list[str],
        held_for: float,
        switch_seconds: float,
        holding_work: bool,
    ) -> bool:
        """`queued`: the models with claimable work, the one to serve first first."""
        if not queued or queued[0] == held:
            return False
        return not holding_work or held_for >= self.residency(switch_seconds)


def load_cost(load_seconds: dict[str, float], model: str) -> float:
    """The last measured load of `model`, else the dearest one measured (0 before any)."""
    return load_seconds.get(model, max(load_seconds.values(), default=0.0))


def wait_for(
    shown: dict[str, Any], model: str, held_for: float, holding_work: bool
) -> float | None:
    """Seconds until a switching worker (its row's figures) serves `model`, at the soonest:
    the residency left on the model it holds (none if that one is idle), then loading `model`.
    None if it does not serve `model`."""
    if model not in shown["models"]:
        return None
    if model == shown["holding"]:
        return 0.0
    cost = load_cost(shown["load_seconds"], model)
    left = SwitchRule(shown["min_residency"]).residency(cost) - held_for if holding_work else 0.0
    return max(left, 0.0) + cost
