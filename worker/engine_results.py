"""An engine's answer to one line, and the OpenAI error bodies the engine adapter answers with.

Part of the engine adapter (vLLM's `ErrorResponse`, pydantic's validation errors), kept apart
from `worker.engine`; imports nothing of vLLM.
"""

from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

import orjson

from app.core.progress import Usage
from app.endpoints import SUPPORTED


@dataclass(frozen=True)
class EngineResult:
    """One line's answer: the HTTP status and JSON body the endpoint would send.

    The body is a dict, or the JSON bytes vLLM's serving rendered for it (an embedding's
    vectors): those go into the output line as they are, not parsed and encoded again.
    """

    status_code: int
    body: dict[str, Any] | bytes
    usage: Usage

    @property
    def ok(self) -> bool:
        return 200 <= self.status_code < 300

    def parsed_body(self) -> dict[str, Any]:
        if isinstance(self.body, bytes):
            parsed: dict[str, Any] = orjson.loads(self.body)
            return parsed
        return self.body

    def body_json(self) -> dict[str, Any] | orjson.Fragment:
        """The body for `orjson.dumps`: rendered bytes embedded unchanged."""
        return orjson.Fragment(self.body) if isinstance(self.body, bytes) else self.body


def error_result(
    status_code: int, message: str, param: str | None = None, code: str | None = None
) -> EngineResult:
    """An OpenAI error body: `{"error": {"message", "type", "param", "code"}}`."""
    if code is None and "maximum context length" in message:
        code = "context_length_exceeded"
    kind = "invalid_request_error" if status_code < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": code}}
    return EngineResult(status_code, body, Usage())


def from_vllm_error(error: Any) -> EngineResult:
    info = error.error
    code = (
        "model_not_found" if info.code == HTTPStatus.NOT_FOUND and info.param == "model" else None
    )
    return error_result(int(info.code), info.message, info.param, code)


def unrouted(url: str, served: list[str]) -> EngineResult:
    if url in SUPPORTED:
        return error_result(400, f"The model does not support the endpoint {url}.", "url")
    # A line of `run-batch` may name any url (the service's validator refuses them).
    return error_result(
        400, f"URL {url} was used. Supported endpoints: {', '.join(served)}.", "url"
    )


def validation_message(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    items = errors(include_url=False)
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}" for e in items[:5]]
    label = "error" if len(items) == 1 else "errors"
    return f"{len(items)} validation {label}: " + "; ".join(parts)


def validation_param(exc: Exception) -> str | None:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return None
    items = errors(include_url=False)
    if not items or not items[0].get("loc"):
        return None
    return str(items[0]["loc"][0])
