"""OpenAI's error envelope: the error every failure is reported as (`app.http_errors` makes it
a response; the CLI reads it without loading the web stack)."""

from typing import Any

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
