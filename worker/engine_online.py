"""The online requests' usage as the engine runs them, reported to `worker.traffic`.

Part of the engine adapter (it wraps vLLM's `AsyncLLM.generate` and `encode`), kept apart
from `worker.engine`.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from worker.traffic import ONLINE_PROJECT, OnlineTraffic, UsageTally


def observe_online(client: Any, traffic: OnlineTraffic) -> None:
    """Report the engine requests of online callers (marked by ONLINE_PROJECT) to `traffic`.

    The serving objects call `generate` and `encode` for batch and online requests alike;
    a batch request gets vLLM's own stream back untouched.
    """
    from vllm.sampling_params import RequestOutputKind

    for name in ("generate", "encode"):
        call = getattr(client, name)
        setattr(client, name, _observed(call, traffic, RequestOutputKind.DELTA))


def _observed(call: Callable[..., Any], traffic: OnlineTraffic, delta: Any) -> Callable[..., Any]:
    def start(*args: Any, **kwargs: Any) -> Any:
        outputs = call(*args, **kwargs)
        project = ONLINE_PROJECT.get()
        if project is None:
            return outputs
        params = args[1] if len(args) > 1 else kwargs.get("sampling_params")
        if params is None:
            params = kwargs.get("pooling_params")
        return _tally(outputs, traffic, project, getattr(params, "output_kind", None) == delta)

    return start


async def _tally(
    outputs: Any, traffic: OnlineTraffic, project: str, delta: bool
) -> AsyncIterator[Any]:
    traffic.arrived()
    usage = UsageTally(requests=1)
    started = False
    try:
        async with aclosing(outputs):
            async for output in outputs:
                if not started:
                    traffic.started()
                    started = True
                _count(usage, output, delta)
                yield output
    finally:
        traffic.left(project, started, usage)


def _count(usage: UsageTally, output: Any, delta: bool) -> None:
    """Token counts from a RequestOutput (or PoolingRequestOutput) as it streams."""
    usage.input_tokens = max(usage.input_tokens, len(output.prompt_token_ids or ()))
    cached = int(getattr(output, "num_cached_tokens", 0) or 0)
    usage.cached_tokens = max(usage.cached_tokens, cached)
    completions = getattr(output, "outputs", None)
    if not isinstance(completions, list):
        return  # a pooling output: no generated tokens
    made = sum(len(c.token_ids) for c in completions)
    usage.output_tokens = usage.output_tokens + made if delta else made
