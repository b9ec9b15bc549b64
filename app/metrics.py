"""Prometheus metrics: deployment state read from the database at scrape time, plus HTTP latency.

Reading the database makes the figures the same whichever API replica is scraped and
whichever worker did the work (no multi-process bookkeeping).
"""

import time
from collections.abc import Iterator

from fastapi import APIRouter, FastAPI, Request, Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from starlette.types import ASGIApp, Receive, Scope, Send

from app.asgi import HttpMiddleware
from app.config import Settings
from app.core.states import BatchApi, BatchStatus
from app.logging import ResponseWatch
from app.schemas.admin import WorkerState
from app.services import monitoring, online_usage
from app.services.stats import StatsReader
from app.version import overnight_version


class DatabaseCollector(Collector):
    """Batches, queue depth, requests, tokens and workers, as the database has them."""

    def __init__(self, settings: Settings, stats: StatsReader) -> None:
        self.settings = settings
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self.stats.get()
        totals, workers = stats.totals, stats.workers
        yield _batches_metric(totals)
        yield _queue_metric(totals, self.settings, workers)
        yield from _done_metrics(totals)
        yield _histogram(
            "overnight_batch_duration_seconds",
            "Seconds from a batch's creation to its end, by model.",
            stats.durations,
        )
        yield _histogram(
            "overnight_batch_queue_wait_seconds",
            "Seconds from a batch's creation until it was in progress, by model.",
            stats.waits,
        )
        yield from _worker_metrics(workers)
        per_tenant = self.settings.metrics_per_batch
        yield _throughput_metric(stats.running, per_tenant)
        yield from _online_metrics(stats.online, per_tenant)


def _batches_metric(totals: monitoring.Totals) -> Metric:
    batches = GaugeMetricFamily(
        "overnight_batches",
        "Batches by status and by the API they were created through (anthropic: Message Batches).",
        labels=["api", "status"],
    )
    for api in BatchApi:
        for status in BatchStatus:
            batches.add_metric([api, status], totals.batches_by_api_status.get((api, status), 0))
    return batches


# Labels that name a tenant's objects: shown only with `metrics_per_batch`, since
# `/metrics` needs no key. Without them, samples that differ only there are summed.
TENANT_LABELS = ("batch", "project")


class _Samples:
    """Samples of one family, keyed by its label values, with tenant labels dropped
    (and their samples added up) unless they are shown."""

    def __init__(self, labels: list[str], per_tenant: bool) -> None:
        self.labels = [n for n in labels if per_tenant or n not in TENANT_LABELS]
        self.values: dict[tuple[str, ...], float] = {}

    def add(self, value: float, **labels: str) -> None:
        key = tuple(labels[name] for name in self.labels)
        self.values[key] = self.values.get(key, 0.0) + value

    def into(self, family: GaugeMetricFamily | CounterMetricFamily) -> Metric:
        for key, value in self.values.items():
            family.add_metric(list(key), value)
        return family


def _online_metrics(rows: list[online_usage.UsageRow], per_tenant: bool) -> Iterator[Metric]:
    requests = _Samples(["project", "model"], per_tenant)
    tokens = _Samples(["kind", "project", "model"], per_tenant)
    for row in rows:
        requests.add(row.requests, project=row.project, model=row.model)
        for kind, count in (
            ("prompt", row.input_tokens),
            ("generated", row.output_tokens),
            ("cached", row.cached_tokens),
        ):
            tokens.add(count, kind=kind, project=row.project, model=row.model)
    yield requests.into(
        CounterMetricFamily(
            "overnight_online_requests",
            "Engine requests of workers' online APIs (by the caller's project if shown).",
            labels=requests.labels,
        )
    )
    yield tokens.into(
        CounterMetricFamily(
            "overnight_online_tokens",
            "Tokens of workers' online APIs (by the caller's project if shown).",
            labels=tokens.labels,
        )
    )


def _queue_metric(
    totals: monitoring.Totals, settings: Settings, workers: list[monitoring.WorkerView]
) -> Metric:
    queue = GaugeMetricFamily(
        "overnight_queue_requests",
        "Requests of in-progress batches that have no result yet, by model.",
        labels=["model"],
    )
    # Every model a worker could be started for has a series, 0 when idle, so that a
    # per-model autoscaler query always has a value.
    known = {m.name for m in settings.models} | {w.worker.model for w in workers}
    for model in sorted(known | totals.queued_by_model.keys()):
        queue.add_metric([model], totals.queued_by_model.get(model, 0))
    return queue


def _done_metrics(totals: monitoring.Totals) -> Iterator[Metric]:
    requests = CounterMetricFamily(
        "overnight_requests",
        "Batch requests with a persisted result.",
        labels=["outcome", "model"],
    )
    tokens = CounterMetricFamily(
        "overnight_tokens", "Tokens of persisted batch results.", labels=["kind", "model"]
    )
    for model, done in sorted(totals.done_by_model.items()):
        requests.add_metric(["completed", model], done.completed)
        requests.add_metric(["failed", model], done.failed)
        tokens.add_metric(["prompt", model], done.input_tokens)
        tokens.add_metric(["generated", model], done.output_tokens)
        # Prompt tokens the prefix cache had.
        tokens.add_metric(["cached", model], done.cached_tokens)
    yield from (requests, tokens)


def _histogram(name: str, documentation: str, by_model: dict[str, monitoring.Durations]) -> Metric:
    histogram = HistogramMetricFamily(name, documentation, labels=["model"])
    for model, d in sorted(by_model.items()):
        buckets = [(floatToGoString(b), n) for b, n in zip(d.bounds, d.at_most, strict=True)]
        histogram.add_metric([model], [*buckets, ("+Inf", d.count)], d.total_seconds)
    return histogram


def _throughput_metric(running: list[monitoring.BatchView], per_tenant: bool) -> Metric:
    rates = _Samples(["batch", "model", "unit"], per_tenant)
    now = time.time()
    for view in running:
        throughput = view.throughput(now)
        rates.add(
            throughput.per_second,
            batch=view.batch.id,
            model=view.batch.model or "",
            unit=throughput.unit,
        )
    return rates.into(
        GaugeMetricFamily(
            "overnight_batch_throughput",
            "What each running batch makes per second of its running time (output tokens; "
            "embeddings: input tokens or inputs); summed by model unless batches are shown.",
            labels=rates.labels,
        )
    )


def _worker_metrics(workers: list[monitoring.WorkerView]) -> Iterator[Metric]:
    live = [w for w in workers if w.state in (WorkerState.RUNNING, WorkerState.IDLE)]
    count = GaugeMetricFamily("overnight_workers", "Live workers by model.", labels=["model"])
    for model in sorted({w.worker.model for w in live}):
        count.add_metric([model], sum(1 for w in live if w.worker.model == model))
    yield count
    labels = ["worker", "model"]
    rate = GaugeMetricFamily(
        "overnight_worker_tokens_per_second", "Tokens/s each live worker reports.", labels=labels
    )
    busy = GaugeMetricFamily(
        "overnight_worker_busy", "1 while a live worker holds a shard, else 0.", labels=labels
    )
    age = GaugeMetricFamily(
        "overnight_worker_heartbeat_age_seconds",
        "Seconds since a live worker's heartbeat.",
        labels=labels,
    )
    # vLLM's scheduler gauges, as each worker's engine last reported them (heartbeat).
    running = GaugeMetricFamily(
        "overnight_worker_engine_running_requests",
        "Requests a live worker's vLLM engine is running.",
        labels=labels,
    )
    waiting = GaugeMetricFamily(
        "overnight_worker_engine_waiting_requests",
        "Requests waiting in a live worker's vLLM engine.",
        labels=labels,
    )
    kv_cache = GaugeMetricFamily(
        "overnight_worker_kv_cache_usage_ratio",
        "The fraction of a live worker's KV cache in use (0 to 1).",
        labels=labels,
    )
    for w in live:
        key = [w.worker.id, w.worker.model]
        rate.add_metric(key, w.worker.tokens_per_second)
        busy.add_metric(key, 1.0 if w.state == WorkerState.RUNNING else 0.0)
        age.add_metric(key, w.heartbeat_age)
        running.add_metric(key, w.worker.engine_running)
        waiting.add_metric(key, w.worker.engine_waiting)
        kv_cache.add_metric(key, w.worker.kv_cache_usage)
    yield from (rate, busy, age, running, waiting, kv_cache)


class Metrics:
    """One registry per app, so that several apps (tests) can live in one process."""

    def __init__(self, settings: Settings, stats: StatsReader) -> None:
        # `_created` series tell Prometheus users nothing here and double the exposition.
        disable_created_metrics()
        self.registry = CollectorRegistry()
        self.registry.register(DatabaseCollector(settings, stats))
        build = Info("overnight_build", "The running overnight build.", registry=self.registry)
        build.info({"version": overnight_version()})
        self.http_latency = Histogram(
            "overnight_http_request_duration_seconds",
            "HTTP request latency by route template.",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )


class HttpMetricsMiddleware(HttpMiddleware):
    """Observes every request's latency, labelled by route template (not raw path)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch.send)
        finally:
            route = scope.get("route")
            self.metrics.http_latency.labels(
                scope.get("method", ""), getattr(route, "path", "unmatched"), str(watch.status)
            ).observe(watch.seconds)


router = APIRouter(include_in_schema=False)


@router.get("/metrics")
def metrics_endpoint(request: Request) -> Response:
    """Prometheus text exposition."""
    metrics: Metrics = request.app.state.metrics
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: FastAPI, settings: Settings, stats: StatsReader) -> None:
    """Adds `/metrics` and the latency middleware to an app."""
    app.state.metrics = Metrics(settings, stats)
    app.include_router(router)
    app.add_middleware(HttpMetricsMiddleware, metrics=app.state.metrics)
