"""What a caller of the worker's online API may reach: vLLM's inference routes, and no media
URL the deployment does not allow.

vLLM's app also carries its engine's operations (`/scale_elastic_ep`, `/pause`, `/sleep`,
`/reset_prefix_cache`, profiling, LoRA loading, `/collective_rpc` in its dev mode, …) and
routes on objects that belong to no project (`/v1/responses/{id}`,
`/inference/v1/abort_requests` by request id). The worker runs its engine for the batches,
so those are nobody's to call, an admin's neither: they answer 404 as routes that do not
exist. A websocket (vLLM's realtime audio) is closed: it would pass unauthenticated.
"""

import asyncio

import orjson
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocketClose

from app.errors import OpenAIError
from app.http_errors import error_response
from app.services.media_urls import REFUSED_CODE, MediaRule, media_urls

# Answered without a key.
PROBES = frozenset({"/health", "/ping"})
INFERENCE_ROUTES = frozenset(
    {
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",  # Anthropic's Messages API (vLLM's `anthropic` router)
        "/v1/embeddings",
        "/v1/score",
        "/v1/rerank",
        "/score",
        "/rerank",
        "/pooling",
        "/classify",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/tokenize",
        "/detokenize",
    }
)
_REACHABLE = INFERENCE_ROUTES | PROBES
_WITH_BODY = frozenset({"POST", "PUT", "PATCH"})


class InferenceOnly:
    """Pure ASGI middleware: the probes and `INFERENCE_ROUTES`; any other path is a 404."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await WebSocketClose()(scope, receive, send)
        elif scope["type"] != "http" or scope["path"] in _REACHABLE:
            await self.app(scope, receive, send)
        else:
            missing = OpenAIError(
                f"Invalid URL ({scope['method']} {scope['path']})", status_code=404
            )
            await error_response(missing)(scope, receive, send)


class MediaScreen:
    """Pure ASGI middleware: a body with a media URL the deployment does not allow is answered
    400 before vLLM reads it (and fetches the URL), as a batch line with it would be."""

    def __init__(self, app: ASGIApp, rule: MediaRule) -> None:
        self.app = app
        self.rule = rule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _WITH_BODY or _is_form(scope):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return  # the client left
        refused = None
        if urls := media_urls(_json_or_none(body)):
            # Resolving a host blocks.
            refused = await asyncio.to_thread(self.rule.first_refusal, urls)
        if refused is None:
            await self.app(scope, _replay(body, receive), send)
            return
        error = OpenAIError(refused.message, param=refused.param, code=REFUSED_CODE)
        await error_response(error)(scope, receive, send)


def _is_form(scope: Scope) -> bool:
    # vLLM's form routes take uploaded files (audio), never URLs; they may be large.
    content_type = Headers(scope=scope).get("content-type", "")
    return content_type.lower().startswith("multipart/form-data")


async def _read_body(receive: Receive) -> bytes | None:
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _json_or_none(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None  # vLLM answers a body that is not JSON


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` for the app: the body read already, then the client's own messages."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
