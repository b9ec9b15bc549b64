"""OpenAI's error envelope for every failure, and the handlers that produce it."""

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.storage.base import StorageFull

log = logging.getLogger("overnight.api")

_TYPES = {401: "invalid_request_error", 403: "invalid_request_error", 429: "rate_limit_error"}


class OpenAIError(Exception):
    """An error the API reports to the client as `{"error": {...}}`."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.type = type or _TYPES.get(
            status_code, "server_error" if status_code >= 500 else "invalid_request_error"
        )
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def not_found(kind: str, object_id: str, param: str = "id") -> OpenAIError:
    return OpenAIError(f"No such {kind} object: {object_id}", status_code=404, param=param)


def error_response(error: OpenAIError) -> JSONResponse:
    headers = dict(error.headers)
    # The SDK retries 409 and 5xx by default; a client error will not change on retry.
    if 400 <= error.status_code < 500 and error.status_code not in (408, 429):
        headers.setdefault("x-should-retry", "false")
    return JSONResponse(error.body(), status_code=error.status_code, headers=headers)


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "header", "form")]
    return ".".join(parts) or None


def _validation_message(err: dict[str, Any]) -> str:
    param = _param_from_loc(tuple(err.get("loc", ())))
    msg = str(err.get("msg", "Invalid value"))
    if err.get("type") == "missing":
        return f"Missing required parameter: '{param}'."
    return f"Invalid '{param}': {msg[0].lower() + msg[1:]}." if param else msg


def validation_error(errors: list[Any]) -> OpenAIError:
    first = errors[0] if errors else {}
    code = "missing_required_parameter" if first.get("type") == "missing" else "invalid_value"
    return OpenAIError(
        _validation_message(first), param=_param_from_loc(tuple(first.get("loc", ()))), code=code
    )


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route takes at this path (Starlette names only the first route's)."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        match, _ = route.matches(request.scope)
        if match != Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return sorted(methods)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai(_request: Request, exc: OpenAIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(validation_error(list(exc.errors())))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            message = f"Invalid URL ({request.method} {request.url.path})"
        elif exc.status_code == 405:
            message = f"Method {request.method} not allowed for {request.url.path}"
            headers["Allow"] = ", ".join(_allowed_methods(request))
        else:
            message = str(exc.detail)
        return error_response(OpenAIError(message, status_code=exc.status_code, headers=headers))

    @app.exception_handler(StorageFull)
    async def _storage_full(_request: Request, exc: StorageFull) -> JSONResponse:
        log.error("storage full: %s", exc)
        return error_response(
            OpenAIError(
                "The server's file storage is full: nothing of this request was kept. "
                "Try again once space has been freed.",
                status_code=507,
                code="storage_full",
                # The SDK would retry a 5xx at once; space comes back only when someone acts.
                headers={"x-should-retry": "false"},
            )
        )

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, _exc: Exception) -> JSONResponse:
        return error_response(
            OpenAIError("The server had an error while processing your request.", status_code=500)
        )
