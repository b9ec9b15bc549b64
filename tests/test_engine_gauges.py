"""What the worker hands vLLM as stat loggers (`worker.engine_gauges`), against vLLM 0.32's own
`StatLoggerManager`: the gauges get each step's scheduler stats, and vLLM's Prometheus logger,
whose `/metrics` no worker serves (`tests/test_online.py` finds it a 404), is left out.
"""

from typing import Any, cast

from worker.engine_gauges import EngineStats, Gauges, unscraped_prometheus


def manager(loggers: list[Any]) -> Any:
    from vllm.v1.metrics.loggers import StatLoggerManager

    return StatLoggerManager(
        vllm_config=cast(Any, None), custom_stat_loggers=loggers, enable_default_loggers=False
    )


def test_an_unscraped_engine_records_its_gauges_and_no_prometheus_metrics() -> None:
    from prometheus_client import REGISTRY
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.metrics.stats import SchedulerStats

    before = set(REGISTRY._names_to_collectors)
    gauges = Gauges()
    stats = manager([gauges.logger, unscraped_prometheus()])
    vllms = [s for s in stats.stat_loggers if type(s) is PrometheusStatLogger]
    assert vllms == []
    stats.record(SchedulerStats(num_running_reqs=3, num_waiting_reqs=2, kv_cache_usage=0.5), None)
    stats.log()
    assert gauges.latest == EngineStats(running=3, waiting=2, kv_cache_usage=0.5)
    assert set(REGISTRY._names_to_collectors) == before  # nothing registered, nothing observed
