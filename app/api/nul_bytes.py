"""No NUL byte reaches the database: PostgreSQL cannot store one in text, and SQLite must
answer as PostgreSQL does.

A path holding one names no object (404); a query parameter or a JSON string holding
one is an invalid value (400). Multipart text fields need no check of their own: each is
an enum, a number or a filename, and filenames refuse every control character.
"""

from collections.abc import Iterator
from typing import Any
from urllib.parse import parse_qsl

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.errors import OpenAIError
from app.http_errors import error_response
from app.schemas.message_batches import ANTHROPIC_PATHS, anthropic_error

NUL = "\x00"


def _strings(data: Any) -> Iterator[tuple[str, str]]:
    """(dotted path, text) of every key and string in parsed JSON, without recursion."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            yield path, value
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else key
                yield path or key, key
                stack.append((child, item))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", item) for i, item in enumerate(value))


def nul_refused(param: str) -> OpenAIError:
    shown = param.replace(NUL, "\\u0000")
    return OpenAIError(
        f"Invalid '{shown}': text must not contain NUL (\\u0000) characters.",
        param=shown,
        code="invalid_value",
    )


def check_json(data: Any) -> None:
    """Refuses parsed JSON with a NUL in any key or string."""
    for path, text in _strings(data):
        if NUL in text:
            raise nul_refused(path)


class RejectNulMiddleware:
    """Answers a request whose path or query holds a NUL before any route sees it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            error = self._refusal(scope)
            if error is not None:
                await _answer(scope["path"], error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def _refusal(scope: Scope) -> OpenAIError | None:
        path: str = scope["path"]
        if NUL in path:
            shown = path.replace(NUL, "\\u0000")
            return OpenAIError(f"Invalid URL ({scope['method']} {shown})", status_code=404)
        query = scope.get("query_string", b"")
        if b"%00" in query:
            for name, value in parse_qsl(query.decode("latin-1"), keep_blank_values=True):
                if NUL in name or NUL in value:
                    return nul_refused(name)
        return None


def _answer(path: str, error: OpenAIError) -> JSONResponse:
    """The refusal in the envelope of the API the path belongs to."""
    if path.startswith(ANTHROPIC_PATHS):
        body = anthropic_error(error.status_code, error.message)
        return JSONResponse(body, status_code=error.status_code)
    return error_response(error)
