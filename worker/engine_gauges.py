"""The engine scheduler's gauges (running, waiting, KV cache), as vLLM's stat loggers get them.

Part of the engine adapter (vLLM's `StatLoggerBase`, imported lazily), kept apart from
`worker.engine`.
"""

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class EngineStats:
    """The engine scheduler's latest step, as vLLM's own stat loggers receive it."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # the fraction of the KV cache's blocks in use


class Gauges:
    """Keeps the latest scheduler stats that vLLM hands its stat loggers (per engine step).

    It is registered as a custom stat logger: vLLM then collects scheduler stats without
    its default loggers (no periodic log lines, no second Prometheus registry).
    """

    def __init__(self) -> None:
        self.latest = EngineStats()

    def logger(self, _vllm_config: Any, _engine_index: int = 0) -> Any:
        """A `PerEngineStatLoggerFactory`: vLLM calls it once per engine."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        gauges = self

        class GaugeLogger(StatLoggerBase):
            def __init__(self, _config: Any = None, _index: int = 0) -> None:
                pass

            def record(
                self,
                scheduler_stats: Any,
                iteration_stats: Any,
                mm_cache_stats: Any = None,
                engine_idx: int = 0,
            ) -> None:
                if scheduler_stats is not None:
                    gauges.latest = EngineStats(
                        running=scheduler_stats.num_running_reqs,
                        waiting=scheduler_stats.num_waiting_reqs
                        + scheduler_stats.num_skipped_waiting_reqs,
                        kv_cache_usage=float(scheduler_stats.kv_cache_usage),
                    )

            def log_engine_initialized(self) -> None:
                pass

        return GaugeLogger()
