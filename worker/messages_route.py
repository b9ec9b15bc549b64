"""`/v1/messages` lines through vLLM's Anthropic serving class (pinned: vLLM 0.32).

vLLM's `AnthropicServingMessages.create_messages` turns the request into a chat completion
and takes the engine request id and the priority from the HTTP request's headers only
(`X-Request-Id`, `X-Vllm-Priority`): so each line gets a request of its own carrying them,
and the answer is the body `vllm serve` sends (`model_dump(exclude_none=True)`).
Imported lazily by `worker.engine_routes`, with vLLM.
"""

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from vllm.entrypoints.anthropic.protocol import AnthropicMessagesRequest, AnthropicMessagesResponse
from vllm.entrypoints.generate.base.serving import PRIORITY_HEADER


class BatchMessagesRequest(AnthropicMessagesRequest):
    """A Messages request with the two fields `Engine.run` sets on every request it serves."""

    request_id: str | None = None
    priority: int = 0


def _headers_request(request: BatchMessagesRequest) -> Request:
    headers = [(PRIORITY_HEADER.lower().encode(), str(request.priority).encode())]
    if request.request_id is not None:
        headers.append((b"x-request-id", request.request_id.encode()))
    scope = {"type": "http", "method": "POST", "path": "/v1/messages", "headers": headers}
    return Request(scope)


def messages_server(messages: Any) -> Any:
    """`serve` for the route: the Messages answer as vLLM's router sends it."""

    async def serve(request: BatchMessagesRequest) -> Any:
        answer = await messages.create_messages(request, _headers_request(request))
        if isinstance(answer, AnthropicMessagesResponse):
            body = orjson.dumps(answer.model_dump(mode="json", exclude_none=True))
            return Response(body, media_type="application/json")
        return answer  # an ErrorResponse (or a stream, refused by the caller)

    return serve
