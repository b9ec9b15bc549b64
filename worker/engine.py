"""The one module that touches vLLM internals (pinned: vLLM 0.32).

It builds the engine client and vLLM's OpenAI serving objects in process, the way
`vllm/entrypoints/launchers/run_batch.py` does, so each line gets the body `vllm serve`
would answer. Everything else in the worker sees only `Engine`.
"""

from argparse import Namespace
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Protocol

import orjson

from app.core.progress import Usage, usage_of
from app.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
    SUPPORTED,
    TRANSCRIPTIONS,
    TRANSLATIONS,
    canonical,
)
from app.logging import root_level_kept
from app.schemas.models import ANNOUNCEMENT_KEY, Announcement
from worker.adapters import ADAPTER_LOAD_FAILED
from worker.engine_lora import adapter_folder, adapter_rule, announced_adapters
from worker.traffic import ONLINE_PROJECT, OnlineTraffic, UsageTally

# Under `--scheduling-policy priority` batch requests run after every online request (vLLM
# runs lower values first; online requests default to 0). A batch line's own positive
# priority still orders it among batch requests.
BATCH_PRIORITY = 1_000_000


@dataclass(frozen=True)
class EngineResult:
    """One line's answer: the HTTP status and JSON body the endpoint would send."""

    status_code: int
    body: dict[str, Any]
    usage: Usage

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300


@dataclass(frozen=True)
class EngineStats:
    """The engine scheduler's latest step, as vLLM's own stat loggers receive it."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # the fraction of the KV cache's blocks in use


class Engine(Protocol):
    """What the scheduler needs from an engine; `tests` have a scripted fake of it."""

    served_names: list[str]
    max_num_seqs: int
    # The engine's settings as it runs them, for the dashboard (JSON-able).
    configuration: dict[str, Any]

    def stats(self) -> EngineStats:
        """The latest gauges of the engine's scheduler."""
        ...

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        """Answer one request body; never raises for a bad request (that is a 4xx result)."""
        ...

    async def abort(self, request_ids: Iterable[str]) -> None:
        """Stop these requests inside the engine now."""
        ...


class EngineDeadError(RuntimeError):
    """The engine cannot answer any more: the worker must stop, not record failures."""


def error_result(
    status_code: int, message: str, param: str | None = None, code: str | None = None
) -> EngineResult:
    """An OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""
    if code is None and "maximum context length" in message:
        code = "context_length_exceeded"
    kind = "invalid_request_error" if status_code < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return EngineResult(status_code, body, Usage())


def _from_vllm_error(error: Any) -> EngineResult:
    info = error.error
    code = (
        "model_not_found" if info.code == HTTPStatus.NOT_FOUND and info.param == "model" else None
    )
    return error_result(int(info.code), info.message, info.param, code)


@dataclass(frozen=True)
class Route:
    """How one endpoint's body reaches its vLLM serving object."""

    validate: Callable[[Any], Any]
    serve: Callable[..., Any]
    # Our request id as the request's `request_id`, and as the id vLLM's engine then uses
    # (needed to abort it): both are formats of the bare id.
    request_id: str
    engine_id: str


def _routes(state: Any, args: Namespace) -> dict[str, Route]:
    from pydantic import TypeAdapter
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.pooling.embed.protocol import EmbeddingRequest
    from vllm.entrypoints.pooling.scoring.protocol import RerankRequest, ScoreRequest

    chat = getattr(state, "openai_serving_chat", None)
    completion = getattr(state, "openai_serving_completion", None)
    responses = getattr(state, "openai_serving_responses", None)
    embedding = getattr(state, "serving_embedding", None)
    scores = getattr(state, "serving_scores", None)
    routes: dict[str, Route] = {}
    if chat is not None:
        routes[CHAT] = Route(
            ChatCompletionRequest.model_validate, chat.create_chat_completion, "{}", "chatcmpl-{}"
        )
    if completion is not None:
        routes[COMPLETIONS] = Route(
            CompletionRequest.model_validate, completion.create_completion, "{}", "cmpl-{}"
        )
    if responses is not None:
        # The response's `id` is its request_id; vLLM runs it as sub-request `_0`.
        routes[RESPONSES] = Route(
            ResponsesRequest.model_validate, responses.create_responses, "resp_{}", "resp_{}_0"
        )
    routes.update(_messages_routes(state))
    if embedding is not None:
        routes[EMBEDDINGS] = Route(
            TypeAdapter(EmbeddingRequest).validate_python, embedding, "{}", "embd-{}"
        )
    if scores is not None:
        routes[SCORE] = Route(TypeAdapter(ScoreRequest).validate_python, scores, "{}", "score-{}")
        routes[RERANK] = Route(RerankRequest.model_validate, scores, "{}", "score-{}")
    routes.update(_speech_routes(state, args))
    return routes


def _messages_routes(state: Any) -> dict[str, Route]:
    """Anthropic's Messages API: vLLM converts it to a chat completion (`chatcmpl-` ids)."""
    messages = getattr(state, "anthropic_serving_messages", None)
    if messages is None:
        return {}
    from worker.messages_route import BatchMessagesRequest, messages_server

    serve = messages_server(messages)
    return {MESSAGES: Route(BatchMessagesRequest.model_validate, serve, "{}", "chatcmpl-{}")}


def _speech_routes(state: Any, args: Namespace) -> dict[str, Route]:
    """Audio as vLLM's run_batch takes it: a `file_url` (http(s) or data:) in the body,
    fetched by vLLM's own wrapper (its size limit, `--allowed-media-domains`)."""
    from vllm.entrypoints.launchers.run_batch import (
        BatchTranscriptionRequest,
        BatchTranslationRequest,
        make_transcription_wrapper,
    )

    domains = getattr(args, "allowed_media_domains", None)
    routes: dict[str, Route] = {}
    transcription = getattr(state, "openai_serving_transcription", None)
    if transcription is not None:
        serve = make_transcription_wrapper(False, domains)(transcription.create_transcription)
        routes[TRANSCRIPTIONS] = Route(BatchTranscriptionRequest.model_validate, serve, "{}", "")
    translation = getattr(state, "openai_serving_translation", None)
    if translation is not None:
        serve = make_transcription_wrapper(True, domains)(translation.create_translation)
        routes[TRANSLATIONS] = Route(BatchTranslationRequest.model_validate, serve, "{}", "")
    return routes


class VllmEngine:
    """vLLM's `AsyncLLM` with its serving objects: chat, completion, responses, embedding,
    scoring (score and rerank), transcription and translation."""

    def __init__(
        self,
        engine_client: Any,
        state: Any,
        args: Namespace,
        served_names: list[str],
        gauges: "Gauges",
        configuration: dict[str, Any],
        app: Any = None,
    ) -> None:
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.v1.engine.exceptions import EngineDeadError as VllmEngineDead

        self.client = engine_client
        self.served_names = served_names
        scheduler = engine_client.vllm_config.scheduler_config
        self.max_num_seqs = int(scheduler.max_num_seqs)
        self.batch_priority = BATCH_PRIORITY if str(scheduler.policy) == "priority" else None
        # vLLM's own OpenAI app on these serving objects, when the worker serves online too.
        self.app = app
        self.traffic = OnlineTraffic() if app is not None else None
        if self.traffic is not None:
            _observe_online(engine_client, self.traffic)
        self.configuration = configuration
        self._gauges = gauges
        self._running: dict[str, str] = {}
        self._error_type = ErrorResponse
        self._dead_type = VllmEngineDead
        self._routes = _routes(state, args)
        self.adapter_rule = adapter_rule(engine_client, served_names)
        self.adapter_folder = adapter_folder(state, args, served_names)
        # What the worker's row announces: the API serves these names for these endpoints.
        adapters = announced_adapters(state, served_names[0], self.adapter_folder)
        served = Announcement(names=served_names, endpoints=self.endpoints, adapters=adapters)
        self.configuration[ANNOUNCEMENT_KEY] = served.model_dump()

    @property
    def endpoints(self) -> list[str]:
        return list(self._routes)

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        from starlette.responses import Response

        route = self._routes.get(canonical(endpoint))
        if route is None:
            return _unrouted(canonical(endpoint), self.endpoints)
        for flag in ("stream", "background"):
            if body.get(flag):
                return error_result(
                    400, f"'{flag}' is not supported in batch requests: set it to false.", flag
                )
        try:
            request = route.validate(body)
        except Exception as exc:
            return error_result(400, _validation_message(exc), _validation_param(exc))
        if self.adapter_folder is not None and (
            problem := await self.adapter_folder.problem(body.get("model"))
        ):
            return error_result(400, problem, "model", ADAPTER_LOAD_FAILED)
        fields = type(request).model_fields
        if "request_id" in fields:
            request.request_id = route.request_id.format(request_id)
            self._running[request_id] = route.engine_id.format(request_id)
        if self.batch_priority is not None and "priority" in fields:
            request.priority = self.batch_priority + max(int(request.priority or 0), 0)
        try:
            response = await route.serve(request)
        except self._dead_type as exc:
            raise EngineDeadError(str(exc)) from exc
        except Exception as exc:
            from vllm.entrypoints.serve import create_error_response

            return _from_vllm_error(create_error_response(exc))
        finally:
            self._running.pop(request_id, None)
        if isinstance(response, self._error_type):
            return _from_vllm_error(response)
        if isinstance(response, Response):
            payload = orjson.loads(bytes(response.body))
            if response.status_code >= 400 and isinstance(payload, dict) and "error" in payload:
                return _from_vllm_error(self._error_type.model_validate(payload))
            return EngineResult(response.status_code, payload, usage_of(payload))
        if hasattr(response, "model_dump"):
            payload = response.model_dump(mode="json")
            return EngineResult(200, payload, usage_of(payload))
        return error_result(500, "The engine returned a stream for a non-streaming request.")

    def stats(self) -> EngineStats:
        return self._gauges.latest

    async def abort(self, request_ids: Iterable[str]) -> None:
        # Cancelling a request's task aborts it too; this covers requests still queued.
        ids = [self._running[r] for r in request_ids if r in self._running]
        if ids:
            await self.client.abort(ids)


def _observe_online(client: Any, traffic: OnlineTraffic) -> None:
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


def _unrouted(url: str, served: list[str]) -> EngineResult:
    if url in SUPPORTED:
        return error_result(400, f"The model does not support the endpoint {url}.", "url")
    # A line of `run-batch` may name any url (the service's validator refuses them).
    return error_result(
        400, f"URL {url} was used. Supported endpoints: {', '.join(served)}.", "url"
    )


def _validation_message(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    items = errors(include_url=False)
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in items[:5]]
    label = "error" if len(items) == 1 else "errors"
    return f"{len(items)} validation {label}: " + "; ".join(parts)


def _validation_param(exc: Exception) -> str | None:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return None
    items = errors(include_url=False)
    if not items or not items[0].get("loc"):
        return None
    return str(items[0]["loc"][0])


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


def configuration_of(
    vllm_config: Any, engine_args: Any, dtype_reason: str | None = None
) -> dict[str, Any]:
    """What the engine runs with, after vLLM sized it (and why in that dtype, `worker.dtype`),
    and the arguments that differ from vLLM's defaults (secrets redacted), as `vllm serve`
    logs them."""
    import dataclasses

    from vllm.entrypoints.serve.utils.api_utils import redact_sensitive_args

    model, cache = vllm_config.model_config, vllm_config.cache_config
    scheduler, parallel = vllm_config.scheduler_config, vllm_config.parallel_config
    blocks = cache.num_gpu_blocks or 0
    effective = {
        "model": model.model,
        "dtype": str(model.dtype).removeprefix("torch."),
        "dtype_reason": dtype_reason,
        "max_model_len": model.max_model_len,
        "max_num_seqs": scheduler.max_num_seqs,
        "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        "tensor_parallel_size": parallel.tensor_parallel_size,
        "device": str(vllm_config.device_config.device_type),
        "kv_cache_tokens": blocks * cache.block_size,
        "enable_prefix_caching": bool(cache.enable_prefix_caching),
        "enforce_eager": bool(model.enforce_eager),
    }
    defaults = type(engine_args)(model=engine_args.model)
    given = {
        f.name: getattr(engine_args, f.name)
        for f in dataclasses.fields(engine_args)
        if f.name != "model" and getattr(engine_args, f.name) != getattr(defaults, f.name)
    }
    plain = orjson.loads(orjson.dumps(redact_sensitive_args(given), default=str))
    return {"effective": effective, "arguments": plain}


@asynccontextmanager
async def start_engine(args: Namespace, online: bool = False) -> AsyncIterator[VllmEngine]:
    """Start vLLM from parsed engine arguments; shut it down on exit.

    `online`: also build vLLM's own OpenAI app (`vllm serve`'s routes, middleware and
    exception handlers) on the very serving objects that answer batch lines.

    As vLLM's `build_async_engine_client`, but with our stat logger (its helper takes none).
    """
    from starlette.datastructures import State
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.launchers.cli_args import propagate_flash_late_interaction
    from vllm.usage.usage_lib import UsageContext
    from vllm.v1.engine.async_llm import AsyncLLM

    if getattr(args, "lora_dir", None):
        args.enable_lora = True
    engine_args = AsyncEngineArgs.from_cli_args(args)
    propagate_flash_late_interaction(args, engine_args)
    # vLLM sizes its scheduler (max_num_seqs, max_num_batched_tokens) by usage context; a
    # batch worker is offline throughput work, so it takes the sizes `LLM` gets, not the
    # smaller ones of a latency-bound server. Flags the user sets still win.
    vllm_config = engine_args.create_engine_config(usage_context=UsageContext.LLM_CLASS)
    gauges = Gauges()
    client = AsyncLLM.from_vllm_config(
        vllm_config=vllm_config,
        usage_context=UsageContext.LLM_CLASS,
        enable_log_requests=engine_args.enable_log_requests,
        aggregate_engine_logging=engine_args.aggregate_engine_logging,
        disable_log_stats=engine_args.disable_log_stats,
        stat_loggers=[gauges.logger],
    )
    try:
        await client.reset_mm_cache()
        supported_tasks = await client.get_supported_tasks()
        app = None
        with root_level_kept():
            from vllm.entrypoints.launchers.api_server.entry import init_app_state
            from vllm.entrypoints.launchers.app import build_app

            if online:
                _frontend_defaults(args)
                app = build_app(args, supported_tasks, client.model_config)
            state = app.state if app is not None else State()
            await init_app_state(client, state, args, supported_tasks)
        names = list(args.served_model_name or [args.model])
        dtype_reason = getattr(args, "dtype_reason", None)
        configuration = configuration_of(client.vllm_config, engine_args, dtype_reason)
        yield VllmEngine(client, state, args, names, gauges, configuration, app)
    finally:
        client.shutdown(timeout=vllm_config.shutdown_timeout)


def _frontend_defaults(args: Namespace) -> None:
    """`vllm serve`'s server options (CORS, docs, root path …) at their defaults.

    The worker takes vLLM's engine and OpenAI frontend arguments but not the HTTP server's
    own (`--host`, `--port`, `--api-key` …): overnight listens and authenticates itself.
    """
    from vllm.entrypoints.launchers.cli_args import FrontendArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    defaults = FrontendArgs.add_cli_args(FlexibleArgumentParser()).parse_args([])
    for key, value in vars(defaults).items():
        if not hasattr(args, key):
            setattr(args, key, value)
