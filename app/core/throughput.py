"""A batch's throughput, defined once: what it made per second of its running time.

Generation endpoints count output tokens; embeddings make none, so they count input tokens,
or inputs where the engine reported no tokens. Running time is from `in_progress` until the
batch stopped running (finalizing, or its end) or, while it runs, until now, less any time a
client that followed the batch saw no worker serving its model (`overnight batches submit
--wait`): the engine's first start is not the batch's work.
"""

from dataclasses import dataclass
from typing import Protocol

EMBEDDINGS_ENDPOINT = "/v1/embeddings"
_RUN_ENDS = ("finalizing_at", "cancelled_at", "expired_at", "completed_at", "failed_at")


class Timeline(Protocol):
    """A batch's endpoint and timestamps: a `batches` row and an OpenAI `Batch` both have them."""

    @property
    def endpoint(self) -> str: ...
    @property
    def in_progress_at(self) -> int | None: ...
    @property
    def finalizing_at(self) -> int | None: ...
    @property
    def cancelled_at(self) -> int | None: ...
    @property
    def expired_at(self) -> int | None: ...
    @property
    def completed_at(self) -> int | None: ...
    @property
    def failed_at(self) -> int | None: ...


@dataclass(frozen=True)
class Throughput:
    per_second: float
    unit: str

    def __str__(self) -> str:
        return f"{self.per_second:.1f} {self.unit}"


def running_seconds(batch: Timeline, now: float) -> float:
    """Seconds from `in_progress` to the end of running (or `now`); 0 before it started."""
    if batch.in_progress_at is None:
        return 0.0
    ends = (getattr(batch, name) for name in _RUN_ENDS)
    end = next((t for t in ends if t is not None), now)
    return max(float(end - batch.in_progress_at), 0.0)


def batch_throughput(
    batch: Timeline,
    now: float,
    *,
    input_tokens: int,
    output_tokens: int,
    completed: int,
    waited: float = 0.0,
) -> Throughput:
    """Output tokens/s; for embeddings input tokens/s, or inputs/s without token counts.

    `waited`: seconds of the running time no worker served the batch's model, left out."""
    if batch.endpoint != EMBEDDINGS_ENDPOINT:
        made, unit = output_tokens, "tok/s"
    elif input_tokens:
        made, unit = input_tokens, "input tok/s"
    else:
        made, unit = completed, "inputs/s"
    seconds = running_seconds(batch, now) - waited
    if waited:
        seconds = max(seconds, 1.0)  # the batch's timestamps count whole seconds
    return Throughput(made / seconds if seconds > 0 else 0.0, unit)
