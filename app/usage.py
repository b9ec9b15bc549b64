"""Token counts of one response body, as OpenAI's batch `usage` sums them."""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Usage:
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
