"""Structured logs: one JSON object a line, carrying the request id of the HTTP request."""

import logging
import sys
import time
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else was passed with `extra=` and is logged.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)
# Routes polled by machines (probes, Prometheus, the dashboard's live feeds): logged at
# DEBUG so that they do not drown the rest.
_QUIET_PATHS = ("/healthz", "/readyz", "/metrics")
_QUIET_PREFIX = "/dashboard/api/"
# Not logged either: uvicorn's copy of the message in ANSI colours, for its own console.
_NOT_EXTRAS = _STANDARD_ATTRS | {"color_message"}

access_log = logging.getLogger("overnight.access")


class JsonFormatter(logging.Formatter):
    """Formats a record as `{"ts", "level", "logger", "message", "request_id", ...extra}`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        if request_id:
            entry["request_id"] = request_id
        for key, value in record.__dict__.items():
            if key not in _NOT_EXTRAS and key not in entry and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


class TextFormatter(logging.Formatter):
    """Plain lines for a terminal, still showing the request id."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        return f"{line} [{request_id}]" if request_id else line


def _is_quiet(method: str | None, path: str) -> bool:
    return path in _QUIET_PATHS or (method == "GET" and path.startswith(_QUIET_PREFIX))


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Route every logger (uvicorn's included) through one stderr handler.

    `fmt` "auto" is text on a terminal and JSON otherwise (a pipe, a file, a container).
    """
    handler = logging.StreamHandler(sys.stderr)
    text = fmt == "text" or (fmt == "auto" and sys.stderr.isatty())
    handler.setFormatter(TextFormatter() if text else JsonFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    # AccessLogMiddleware logs every request with its id; uvicorn's own line would repeat it.
    logging.getLogger("uvicorn.access").disabled = True
    # One line per outgoing request (readiness polls, the SDK) is noise at INFO.
    logging.getLogger("httpx").setLevel(logging.WARNING)


class ResponseWatch:
    """Wraps an ASGI `send` to learn the response's status; times the request."""

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status = 500  # what the client gets if the app fails before answering
        self.started = time.perf_counter()

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self._send(message)

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


class AccessLogMiddleware:
    """Binds the request id to the logging context and logs one line per request."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = request_id_var.set(scope.get("state", {}).get("request_id"))
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch.send)
        finally:
            path = scope.get("path", "")
            access_log.log(
                logging.DEBUG if _is_quiet(scope.get("method"), path) else logging.INFO,
                "%s %s %d",
                scope.get("method"),
                path,
                watch.status,
                extra={
                    "method": scope.get("method"),
                    "path": path,
                    "status": watch.status,
                    "duration_ms": round(watch.seconds * 1000, 2),
                },
            )
            request_id_var.reset(token)
