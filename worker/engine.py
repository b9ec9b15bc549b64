"""The engine adapter: the one place that touches vLLM internals (pinned: vLLM 0.32).

It builds the engine client and vLLM's OpenAI serving objects in process, the way
`vllm/entrypoints/launchers/run_batch.py` does, so each line gets the body `vllm serve`
would answer. Everything else in the worker sees only `Engine`. Its parts: the routes
(`engine_routes`), the answers and errors (`engine_results`), the scheduler gauges
(`engine_gauges`), the online usage (`engine_online`) and LoRA (`engine_lora`).
"""

from argparse import Namespace
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import orjson

from app.core.progress import usage_of
from app.endpoints import EMBEDDINGS, canonical
from app.logging import root_level_kept
from app.schemas.models import ANNOUNCEMENT_KEY, Announcement, StandbyModel, announcement_in
from worker import python_gc
from worker.adapters import ADAPTER_LOAD_FAILED
from worker.engine_embeddings import TemplatedEmbeddings
from worker.engine_gauges import EngineStats, Gauges, unscraped_prometheus
from worker.engine_lora import adapter_rule, announced_adapters, loaded_adapters, lora_adapters
from worker.engine_online import observe_online
from worker.engine_results import (
    EngineResult,
    error_result,
    from_vllm_error,
    unrouted,
    validation_message,
    validation_param,
)
from worker.engine_routes import routes_of, run_pooling_inline
from worker.traffic import OnlineTraffic

# Under `--scheduling-policy priority` batch requests run after every online request (vLLM
# runs lower values first; online requests default to 0). A batch line's own positive
# priority still orders it among batch requests.
BATCH_PRIORITY = 1_000_000


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


class VllmEngine:
    """vLLM's `AsyncLLM` with its serving objects: chat, completion, responses, embedding,
    scoring (score and rerank), transcription and translation."""

    def __init__(
        self,
        engine_client: Any,
        state: Any,
        args: Namespace,
        served_names: list[str],
        gauges: Gauges,
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
            observe_online(engine_client, self.traffic)
        self.configuration = configuration
        self._gauges = gauges
        self._running: dict[str, str] = {}
        self._error_type = ErrorResponse
        self._dead_type = VllmEngineDead
        run_pooling_inline(state)
        self._routes = routes_of(state, args)
        embedding = getattr(state, "serving_embedding", None)
        self._embeddings = (
            TemplatedEmbeddings(embedding, self._routes[EMBEDDINGS].validate, served_names)
            if embedding is not None
            else None
        )
        self.adapter_rule = adapter_rule(engine_client, served_names)
        self.lora_adapters = lora_adapters(state, args, served_names)
        self._state = state
        self._announce()

    def _announce(self) -> None:
        """What the worker's row announces: the API serves these names for these endpoints."""
        names = self.served_names
        adapters = announced_adapters(self._state, names[0], self.lora_adapters)
        served = Announcement(names=names, endpoints=self.endpoints, adapters=adapters)
        served.standby = self.announcement.standby
        self.configuration[ANNOUNCEMENT_KEY] = served.model_dump()

    @property
    def announcement(self) -> Announcement:
        return announcement_in(self.configuration) or Announcement(names=[], endpoints=[])

    def announce_standby(self, standby: list[StandbyModel]) -> None:
        """The models a switching worker loads instead of this one (`worker.switching`)."""
        served = self.announcement
        served.standby = standby
        self.configuration[ANNOUNCEMENT_KEY] = served.model_dump()

    async def sleep(self, level: int) -> None:
        """vLLM's sleep mode: free the accelerator's memory (level 1 keeps the weights in host
        memory, level 2 drops them), keeping the engine to wake."""
        await self.client.sleep(level)

    async def wake_up(self) -> None:
        await self.client.wake_up()

    async def rescan_adapters(self) -> bool:
        """Follow `--lora-dir`'s folder and `--lora-repo`'s listing: whether the
        announcement changed."""
        if self.lora_adapters is None or not await self.lora_adapters.rescan():
            return False
        self._announce()
        return True

    @property
    def endpoints(self) -> list[str]:
        return list(self._routes)

    def loaded_adapters(self) -> frozenset[str] | None:
        """The LoRA adapters loaded now; None when LoRA is off (claims ignore adapters)."""
        return None if self.adapter_rule is None else loaded_adapters(self._state)

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        url = canonical(endpoint)
        route = self._routes.get(url)
        if route is None:
            return unrouted(url, self.endpoints)
        for flag in ("stream", "background"):
            if body.get(flag):
                return error_result(
                    400, f"'{flag}' is not supported in batch requests: set it to false.", flag
                )
        serve = route.serve
        template = None
        if self._embeddings is not None and url == EMBEDDINGS:
            template = await self._embeddings.template_for(body)
        try:
            if template is not None:
                request = template.request_for(body)
                serve = template.serve
            else:
                request = route.validate(body)
        except Exception as exc:
            return error_result(400, validation_message(exc), validation_param(exc))
        if self.lora_adapters is not None and (
            problem := await self.lora_adapters.problem(body.get("model"))
        ):
            return error_result(400, problem, "model", ADAPTER_LOAD_FAILED)
        fields = type(request).model_fields
        if "request_id" in fields:
            request.request_id = route.request_id.format(request_id)
            self._running[request_id] = route.engine_id.format(request_id)
        if self.batch_priority is not None and "priority" in fields:
            request.priority = self.batch_priority + max(int(request.priority or 0), 0)
        try:
            return await self._answer(serve, request)
        finally:
            self._running.pop(request_id, None)

    async def _answer(self, serve: Callable[[Any], Awaitable[Any]], request: Any) -> EngineResult:
        from starlette.responses import Response

        try:
            response = await serve(request)
        except self._dead_type as exc:
            raise EngineDeadError(str(exc)) from exc
        except Exception as exc:
            from vllm.entrypoints.serve import create_error_response

            return from_vllm_error(create_error_response(exc))
        if isinstance(response, EngineResult):  # already answered (`engine_embeddings`)
            return response
        if isinstance(response, self._error_type):
            return from_vllm_error(response)
        if isinstance(response, Response):
            rendered = bytes(response.body)
            payload = orjson.loads(rendered)
            if response.status_code >= 400 and isinstance(payload, dict) and "error" in payload:
                return from_vllm_error(self._error_type.model_validate(payload))
            return EngineResult(response.status_code, rendered, usage_of(payload))
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


def model_length(args: Namespace) -> int:
    """The longest context the model of these engine arguments takes (from its config)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    unbounded = Namespace(**{**vars(args), "max_model_len": None})
    return int(AsyncEngineArgs.from_cli_args(unbounded).create_model_config().max_model_len)


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
        stat_loggers=[gauges.logger, unscraped_prometheus()],
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
        with python_gc.frozen_while_running():
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
