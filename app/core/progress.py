"""Request counts and token sums: of one response body, of a chunk, a shard or a batch."""

from dataclasses import astuple, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class Usage:
    """Token counts of one response body, as OpenAI's batch `usage` sums them."""

    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0


def usage_of(body: Any) -> Usage:
    """The `usage` of a success body; zeros for anything without one."""
    usage = body.get("usage") if isinstance(body, dict) else None
    if not isinstance(usage, dict):
        return Usage()
    # Chat, completions and embeddings count prompt/completion tokens; Responses input/output.
    given, made = ("input", "output") if "input_tokens" in usage else ("prompt", "completion")
    return Usage(
        input_tokens=_int(usage.get(f"{given}_tokens")),
        cached_tokens=_int(_detail(usage, f"{given}_tokens_details", "cached_tokens")),
        output_tokens=_int(usage.get(f"{made}_tokens")),
        reasoning_tokens=_int(_detail(usage, f"{made}_tokens_details", "reasoning_tokens")),
    )


def _detail(usage: dict[str, Any], outer: str, inner: str) -> Any:
    details = usage.get(outer)
    return details.get(inner) if isinstance(details, dict) else None


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass
class Progress:
    """Request counts and token sums. The `batches` and `shards` tables keep the same columns."""

    completed: int = 0
    failed: int = 0
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, ok: bool, usage: Usage) -> None:
        """Counts one finished request: a success with its usage, or a failure."""
        if not ok:
            self.failed += 1
            return
        self.completed += 1
        self.input_tokens += usage.input_tokens
        self.cached_tokens += usage.cached_tokens
        self.output_tokens += usage.output_tokens
        self.reasoning_tokens += usage.reasoning_tokens

    @classmethod
    def of(cls, row: object) -> "Progress":
        """The counters of anything that has them as attributes (a `Batch` or `Shard` row)."""
        return cls(*(int(getattr(row, name)) for name in PROGRESS_FIELDS))

    def values(self) -> dict[str, int]:
        return dict(zip(PROGRESS_FIELDS, astuple(self), strict=True))


PROGRESS_FIELDS = tuple(f.name for f in fields(Progress))


@dataclass(frozen=True)
class Outcomes:
    """Finished requests as a person reads them: cancelled and expired apart from failed.

    OpenAI's `request_counts.failed` counts all three; `failed` here only the requests that
    ran and failed.
    """

    completed: int
    failed: int
    cancelled: int = 0
    expired: int = 0

    @classmethod
    def of_counts(cls, completed: int, failed: int, cancelled: int, expired: int) -> "Outcomes":
        """From OpenAI's counts, whose `failed` includes `cancelled` and `expired`."""
        return cls(completed, max(failed - cancelled - expired, 0), cancelled, expired)

    def __str__(self) -> str:
        unrun = [
            f"{n} {what}"
            for n, what in ((self.cancelled, "cancelled"), (self.expired, "expired"))
            if n
        ]
        return ", ".join([f"{self.completed} ok", f"{self.failed} failed", *unrun])
