"""Embedding lines that differ only in their text, answered without re-deriving the rest.

Part of the engine adapter (vLLM 0.32's embedding serving, its request and context types),
kept apart from `worker.engine`. A batch of embeddings is mostly lines like
`{"model": M, "input": "…"}`: for each, vLLM's serving validates the body against five
request types and derives the same pooling parameters, model name and prompt options again.
Here that is done once per shape (the body without its input) and each line's request is
that template with its own input; the rendering, the engine, the response building and
every error stay vLLM's own steps (`PoolingBaseServing.__call__` after its `_init_ctx`), so
the answers are byte for byte the same (bench/bench_per_request.py measures the saving).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.core.progress import usage_of
from worker.engine_results import EngineResult

# The shapes whose lines take the template: the embedding request's own scalar options.
SHAPE_KEYS = frozenset(
    {
        "model",
        "encoding_format",
        "dimensions",
        "embed_dtype",
        "endianness",
        "user",
        "priority",
        "truncate_prompt_tokens",
        "truncation_side",
        "add_special_tokens",
        "use_activation",
        "padding",
        "cache_salt",
    }
)
MAX_SHAPES = 64


@dataclass(frozen=True)
class Template:
    """One shape's validated request and what vLLM derived from it for every such line."""

    serving: Any
    request: Any
    model_name: str
    pooling_params: Any
    lora_request: Any
    prompt_extras: dict[str, Any] | None

    def request_for(self, body: dict[str, Any]) -> Any:
        """The line's request: the template's, with the line's input."""
        return self.request.model_copy(update={"input": body["input"]})

    async def serve(self, request: Any) -> Any:
        """`PoolingBaseServing.__call__` from its context on: vLLM's steps and answer, a JSON
        answer as its rendered bytes with the usage vLLM put in them (neither parsed again)."""
        from starlette.responses import JSONResponse
        from vllm.entrypoints.pooling.typing import PoolingServeContext
        from vllm.entrypoints.pooling.utils import get_pooling_usage_payload

        serving = self.serving
        context = PoolingServeContext(
            request=request,
            model_name=self.model_name,
            request_id=f"{serving.request_id_prefix}-{request.request_id}",
            pooling_params=self.pooling_params,
            lora_request=self.lora_request,
            priorities=request.priority,
            prompt_extras=self.prompt_extras,
        )
        io = serving.get_io_processor(request)
        await serving._preprocessing(io, context)
        await serving._prepare_generators(context)
        await serving._collect_batch(context)
        answer = await serving._postprocessing_async(io, context)
        if not isinstance(answer, JSONResponse) or answer.status_code != 200:
            return answer
        usage = usage_of({"usage": get_pooling_usage_payload(context.final_res_batch)})
        return EngineResult(200, bytes(answer.body), usage)


def shape_of(body: dict[str, Any]) -> tuple[tuple[str, Any], ...] | None:
    """The body without its input, when only the input can tell its lines apart; else None."""
    given = body.get("input")
    texts = [given] if isinstance(given, str) else given
    if not isinstance(texts, list) or not texts:
        return None
    if not all(isinstance(text, str) and text for text in texts):
        return None
    shape = []
    for key, value in body.items():
        if key == "input":
            continue
        if key not in SHAPE_KEYS or not isinstance(value, str | int | float | bool | None):
            return None
        shape.append((key, value))
    return tuple(sorted(shape))


class TemplatedEmbeddings:
    """vLLM's embedding serving for lines of a known shape; other lines go the whole way."""

    def __init__(self, serving: Any, validate: Callable[[Any], Any], base_names: list[str]) -> None:
        self._serving = serving
        self._validate = validate
        self._base_names = set(base_names)
        self._templates: dict[tuple[tuple[str, Any], ...], Template | None] = {}

    async def template_for(self, body: dict[str, Any]) -> Template | None:
        """The line's template; None when the line must be validated whole (vLLM's errors
        for a bad body, an adapter's name, an unusual shape)."""
        shape = shape_of(body)
        if shape is None or body.get("model") not in self._base_names:
            return None
        if shape in self._templates:
            return self._templates[shape]
        template = await self._derive(body)
        if len(self._templates) < MAX_SHAPES:
            self._templates[shape] = template  # None too: its lines go the whole way
        return template

    async def _derive(self, body: dict[str, Any]) -> Template | None:
        try:
            request = self._validate(body)
            io = self._serving.get_io_processor(request)
            context = await self._serving._init_ctx(io, request)
        except Exception:
            return None  # the whole way gives the line vLLM's own error
        return Template(
            serving=self._serving,
            request=request,
            model_name=context.model_name,
            pooling_params=context.pooling_params,
            lora_request=context.lora_request,
            prompt_extras=context.prompt_extras,
        )
