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
    its default log lines (`--enable-log-stats` turns them on).
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


def unscraped_prometheus() -> Any:
    """A stand-in for vLLM's Prometheus stat logger: no one can scrape a worker's engine.

    vLLM records a dozen Prometheus observations per finished request for its app's
    `/metrics`, which the worker's online API does not serve (`worker/online_guards.py`);
    the engine's gauges reach the API's `/metrics` through `Gauges` and the heartbeat. Given
    a logger of this class, vLLM leaves its own out (it keeps one Prometheus logger): about
    0.02 ms of the worker's CPU per request (bench/bench_per_request.py).
    """
    from vllm.v1.metrics.loggers import PrometheusStatLogger

    class UnscrapedPrometheus(PrometheusStatLogger):
        def __init__(self, vllm_config: Any = None, engine_indexes: Any = None) -> None:
            pass  # no metrics created, none registered

        def record(self, *args: Any, **kwargs: Any) -> None:
            pass

        def record_admission_rejection(self, reason: str) -> None:
            pass

        def record_sleep_state(self, sleep: int = 0, level: int = 0) -> None:
            pass

        def log_engine_initialized(self) -> None:
            pass

        def log(self) -> None:
            pass

    return UnscrapedPrometheus
