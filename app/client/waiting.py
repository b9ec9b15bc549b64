"""Whether a followed batch waits for a worker, and for how long it did.

A batch is `in_progress` as soon as it is validated, but nothing runs it until a worker serves
its model: after `overnight serve` that is the engine's first start, a minute or more. While
no worker serves the model, `--wait` says so, and that time is left out of the throughput.
The fleet comes from the admin API (`GET /v1/admin/workers`): with a member key it is not
visible, and the batch's status is shown as it is.
"""

from dataclasses import dataclass

import openai
from openai.types import Batch

from app.core.states import BatchStatus

SERVING_STATES = ("idle", "running")


@dataclass(frozen=True)
class Workers:
    """The workers of one model: serving it, or still loading their engine."""

    serving: int
    loading: int

    def describe(self, model: str) -> str:
        loading = f" ({self.loading} loading its engine)" if self.loading else ""
        return f"no worker serves {model} yet{loading}: waiting for a worker"


def workers_of(api: openai.OpenAI, model: str) -> Workers | None:
    """The model's live workers; None where this key may not see the fleet."""
    try:
        page: dict[str, list[dict[str, str]]] = api.get("/admin/workers", cast_to=dict)
    except (openai.PermissionDeniedError, openai.NotFoundError):
        return None
    states = [w["state"] for w in page["data"] if w["model"] == model]
    return Workers(
        serving=sum(state in SERVING_STATES for state in states), loading=states.count("loading")
    )


def may_wait_for_a_worker(batch: Batch) -> bool:
    """Only a batch that is in progress with no result yet can still be waiting for one."""
    counts = batch.request_counts
    done = counts.completed + counts.failed if counts else 0
    return batch.status == BatchStatus.IN_PROGRESS and done == 0 and batch.model is not None


@dataclass
class WaitClock:
    """The seconds a followed batch was seen waiting for a worker, on this machine's monotonic
    clock: from the first poll that saw it waiting to the last one, so never more than it
    waited (its throughput is never overstated)."""

    waited: float = 0.0
    since: float | None = None
    last_seen: float | None = None

    def saw(self, waiting: bool, now: float) -> None:
        if waiting:
            self.since = now if self.since is None else self.since
            self.last_seen = now
        elif self.since is not None and self.last_seen is not None:
            self.waited += self.last_seen - self.since
            self.since = self.last_seen = None

    @property
    def seconds(self) -> float:
        """Waited so far, including a wait still going on."""
        going_on = (self.last_seen or 0.0) - (self.since or 0.0)
        return self.waited + going_on
