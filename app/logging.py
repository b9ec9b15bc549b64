"""Structured logs: one JSON object a line, carrying the request id of the HTTP request.

One stream per process tree: vLLM's loggers, in the worker and in the engine processes it
starts, write through the same handler as overnight's own (see `route_vllm_logs`).
"""

import atexit
import json
import logging
import logging.config
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope, Send

from app.asgi import HttpMiddleware

request_id_var: ContextVar[str | None] = ContextVar("request_id", default=None)

# Attributes every LogRecord has; anything else was passed with `extra=` and is logged.
_STANDARD_ATTRS = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys() | {"message", "asctime"}
)
# Routes polled by machines (probes, Prometheus, the dashboard's live feeds): logged at
# DEBUG so that they do not drown the rest.
_QUIET_PATHS = ("/healthz", "/readyz", "/metrics")
_QUIET_PREFIX = "/dashboard/api/"
# Not logged either: uvicorn's copy of the message in ANSI colours, for its own console;
# vLLM's process name, which every record gets once vLLM is imported (see `_process`).
_NOT_EXTRAS = _STANDARD_ATTRS | {"color_message", "vllm_process_name"}
# vLLM's own chatter (hundreds of lines at start-up) unless VLLM_LOGGING_LEVEL asks for it.
VLLM_DEFAULT_LEVEL = "WARNING"
_CONFIG_PREFIX = "overnight-vllm-logging-"

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
        if process := _process(record):
            entry["process"] = process
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
        if process := _process(record):
            line = f"{line} ({process})"
        request_id = getattr(record, "request_id", None) or request_id_var.get()
        return f"{line} [{request_id}]" if request_id else line


def _process(record: logging.LogRecord) -> str | None:
    """The process a record comes from, when it is not the main one (vLLM's EngineCore)."""
    name = getattr(record, "vllm_process_name", None) or record.processName
    return None if name in ("MainProcess", "", None) else str(name)


def _is_quiet(method: str | None, path: str) -> bool:
    return path in _QUIET_PATHS or (method == "GET" and path.startswith(_QUIET_PREFIX))


def is_text(fmt: str) -> bool:
    """`fmt` "auto" is text on a terminal and JSON otherwise (a pipe, a file, a container)."""
    return fmt == "text" or (fmt == "auto" and sys.stderr.isatty())


def configure_logging(level: str = "info", fmt: str = "auto") -> None:
    """Route every logger (uvicorn's included) through one stderr handler."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter() if is_text(fmt) else JsonFormatter())
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
    logging.captureWarnings(True)


@contextmanager
def root_level_kept() -> Iterator[None]:
    """Undo what imports inside the block do to the root logger's and its handlers' levels.

    vLLM's OpenAI app imports `model_hosting_container_standards`, which sets the root logger
    to ERROR at import (from its own `LOG_LEVEL` default): every INFO line of the worker
    would go silent from then on.
    """
    root = logging.getLogger()
    level, handlers = root.level, [(handler, handler.level) for handler in root.handlers]
    try:
        yield
    finally:
        root.setLevel(level)
        for handler, handler_level in handlers:
            handler.setLevel(handler_level)


def vllm_level() -> str:
    return os.environ.get("VLLM_LOGGING_LEVEL", VLLM_DEFAULT_LEVEL).upper()


def vllm_logging_config(level: str, fmt: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` that sends vLLM's loggers through our one handler."""
    formatter = TextFormatter if is_text(fmt) else JsonFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"overnight": {"()": f"{__name__}.{formatter.__name__}"}},
        "handlers": {
            "overnight": {
                "class": "logging.StreamHandler",
                "formatter": "overnight",
                "stream": "ext://sys.stderr",
            }
        },
        "root": {"handlers": ["overnight"], "level": level.upper()},
        "loggers": {
            "vllm": {
                "handlers": [],
                "propagate": True,
                "level": vllm_level(),
            },
            "httpx": {"level": "WARNING"},
            # Spawned engine processes import overnight's modules again, alembic with them.
            "alembic.runtime.plugins": {"level": "WARNING"},
        },
    }


def configure_child() -> None:
    """In a process spawned by one that called `route_vllm_logs`: the same handlers."""
    path = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    if path and os.path.basename(path).startswith(_CONFIG_PREFIX):
        with open(path) as config:
            logging.config.dictConfig(json.load(config))
        logging.captureWarnings(True)


def route_vllm_logs(level: str, fmt: str) -> None:
    """Make vLLM log through overnight's handler here and in every process it starts.

    vLLM configures its `vllm` logger from `VLLM_LOGGING_CONFIG_PATH` in each of its
    processes (the engine core and its workers are spawned, so they inherit nothing else):
    the file written here gives them all our handler, our format and vLLM's level. Call it
    before vLLM is imported. A user's own VLLM_LOGGING_CONFIG_PATH (or
    VLLM_CONFIGURE_LOGGING=0) wins.
    """
    if "VLLM_LOGGING_CONFIG_PATH" in os.environ or os.environ.get("VLLM_CONFIGURE_LOGGING") == "0":
        return
    fd, path = tempfile.mkstemp(prefix=_CONFIG_PREFIX, suffix=".json")
    with os.fdopen(fd, "w") as config:
        json.dump(vllm_logging_config(level, fmt), config)
    pid = os.getpid()

    def remove() -> None:
        if os.getpid() == pid:  # forked children run atexit hooks too
            os.unlink(path)

    atexit.register(remove)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    # Until vLLM applies the file (when it builds its config), its records reach our root.
    logging.getLogger("vllm").setLevel(vllm_level())
    if not is_text(fmt):
        # Progress bars are for terminals; in a log stream they are unparseable lines.
        os.environ.setdefault("TQDM_DISABLE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        # PyTorch's C++ warnings go straight to the file descriptor, past any handler.
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


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


class AccessLogMiddleware(HttpMiddleware):
    """Binds the request id to the logging context and logs one line per request."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
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
