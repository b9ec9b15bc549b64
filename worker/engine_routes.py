"""Which vLLM serving object answers each endpoint, and how a line's body reaches it.

Part of the engine adapter (vLLM 0.32's serving objects and request models, imported
lazily), kept apart from `worker.engine`.
"""

import asyncio
from argparse import Namespace
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from app.endpoints import (
    CHAT,
    COMPLETIONS,
    EMBEDDINGS,
    MESSAGES,
    RERANK,
    RESPONSES,
    SCORE,
    TRANSCRIPTIONS,
    TRANSLATIONS,
)


@dataclass(frozen=True)
class Route:
    """How one endpoint's body reaches its vLLM serving object."""

    validate: Callable[[Any], Any]
    serve: Callable[..., Any]
    # Our request id as the request's `request_id`, and as the id vLLM's engine then uses
    # (needed to abort it): both are formats of the bare id.
    request_id: str
    engine_id: str


def routes_of(state: Any, args: Namespace) -> dict[str, Route]:
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


def run_pooling_inline(state: Any) -> None:
    """Embeddings, scores and reranks answered without vLLM's thread pool.

    vLLM 0.32's pooling serving hands each request's rendering (tokenization) and its
    response building to a thread pool: two thread hops per request that cost more CPU than
    the work they carry (a pooling input is at most the model's context, tokenized in tens
    of microseconds). Run inline, as vLLM's own `LLM.embed` does, the steps and their
    answers stay vLLM's; only the hops go (bench/bench_per_request.py measures it).
    """
    for name in ("serving_embedding", "serving_scores"):
        if (serving := getattr(state, name, None)) is not None:
            serving._postprocessing_async = _inline(serving._postprocessing)
            serving.io_processor.render_async = _inline(serving.io_processor.render)


def _inline(step: Callable[..., Any]) -> Callable[..., "asyncio.Future[Any]"]:
    """`step` as its `make_async` wrapper is awaited, run at once on the loop's thread."""

    def run(*args: Any, **kwargs: Any) -> "asyncio.Future[Any]":
        future = asyncio.get_running_loop().create_future()
        try:
            future.set_result(step(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future

    return run


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
