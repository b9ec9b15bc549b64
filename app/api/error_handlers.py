"""The API's exception handlers: every failure answered with OpenAI's error envelope."""

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from app.errors import OpenAIError, validation_error
from app.http_errors import error_response
from app.storage.base import StorageFull

log = logging.getLogger("overnight.api")


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
