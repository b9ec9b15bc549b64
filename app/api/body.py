"""Request bodies: size limits while they stream, and JSON read whatever the Content-Type says.

OpenAI's own curl examples post JSON with curl's default form Content-Type, and
the SDK sends `Content-Type: application/json` with an empty body on bodiless POSTs.
"""

import asyncio
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.api.nul_bytes import check_json
from app.asgi import HttpMiddleware
from app.core.sizes import SizeLimit, too_large_message
from app.errors import OpenAIError, validation_error

ModelT = TypeVar("ModelT", bound=BaseModel)


def too_large(limit: SizeLimit, size: int | None = None) -> OpenAIError:
    return OpenAIError(
        too_large_message("The request body", limit, size),
        status_code=413,
        code="request_too_large",
    )


def client_disconnected() -> OpenAIError:
    """Nobody reads this answer: it logs the request as the client's doing (499), not a 500."""
    return OpenAIError(
        "The client disconnected before the body was complete.",
        status_code=499,
        code="client_disconnected",
    )


class BodyTimeoutMiddleware(HttpMiddleware):
    """Ends a request whose body stalls: no bytes for `idle_seconds` is a 408, and the
    connection closes (uvicorn has no body timeout of its own)."""

    def __init__(self, app: ASGIApp, idle_seconds: float) -> None:
        super().__init__(app)
        self.idle_seconds = idle_seconds

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_done = False

        async def receive_in_time() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.idle_seconds)
            except TimeoutError:
                raise OpenAIError(
                    f"The request body stalled: no bytes for {self.idle_seconds:g} seconds.",
                    status_code=408,
                    code="request_timeout",
                    # The rest of the body may still come: the connection cannot be reused.
                    headers={"connection": "close"},
                ) from None
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message

        await self.app(scope, receive_in_time, send)


def check_declared_length(request: Request, limit: SizeLimit, overhead: int = 0) -> None:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit.bytes + overhead:
        raise too_large(limit, int(declared))


async def read_body(request: Request, limit: SizeLimit) -> bytes:
    """The whole body, refused (413) as soon as it passes the limit."""
    check_declared_length(request, limit)
    received = bytearray()
    try:
        async for chunk in request.stream():
            received += chunk
            if len(received) > limit.bytes:
                raise too_large(limit)
    except ClientDisconnect:
        raise client_disconnected() from None
    return bytes(received)


async def read_json(
    request: Request, model: type[ModelT], limit_setting: str = "max_json_body_bytes"
) -> ModelT:
    raw = await read_body(request, request.app.state.settings.size_limit(limit_setting))
    try:
        data: Any = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError:
        raise OpenAIError(
            "We could not parse the JSON body of your request. (HINT: This likely means you "
            "aren't using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
        ) from None
    if not isinstance(data, dict):
        raise OpenAIError("The request body must be a JSON object.")
    check_json(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise validation_error([{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]) from None


def json_post(router: APIRouter, path: str, model: type[BaseModel], **route: Any) -> Any:
    """A POST route whose body is `model`, read with `read_json` and documented as its schema."""
    body = {
        "required": True,
        "content": {"application/json": {"schema": model.model_json_schema()}},
    }
    return router.post(path, openapi_extra={"requestBody": body}, **route)
