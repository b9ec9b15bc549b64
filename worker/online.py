"""The worker's online API: vLLM's own OpenAI app on the worker's engine, behind overnight's keys.

`overnight worker --online-port PORT` serves the inference routes `vllm serve` serves for the
worker's model (`/v1/chat/completions`, `/v1/completions`, `/v1/responses`, `/v1/embeddings`,
`/v1/models`, streaming …; not vLLM's operational routes: `online_guards`) from the app and
serving objects the batch lines already use. Every request but the probes is authenticated
as the batch API does it (same keys, projects and open mode), and runs with its project
marked, so that the engine adapter counts its usage for that project; the counts are added
to the database every second, where `/metrics` and the dashboard read them.
"""

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from typing import Any

import uvicorn
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.config import Settings
from app.db.session import session_scope
from app.errors import OpenAIError
from app.http_errors import error_response
from app.http_server import server_options
from app.services import online_usage
from app.services.auth import Access, Principal, authenticate
from app.services.media_urls import MediaRule
from worker.online_guards import PROBES, InferenceOnly, MediaScreen
from worker.traffic import ONLINE_PROJECT, OnlineTraffic

log = logging.getLogger("overnight.worker")

USAGE_FLUSH_SECONDS = 1.0
SHUTDOWN_SECONDS = 5.0


class ProjectAuth:
    """Pure ASGI middleware: the caller's key decides the project its requests count for."""

    def __init__(self, app: ASGIApp, settings: Settings, access: Access) -> None:
        self.app = app
        self.settings = settings
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") == "OPTIONS" or scope["path"] in PROBES:
            await self.app(scope, receive, send)
            return
        authorization = Headers(scope=scope).get("authorization")
        try:
            principal = await asyncio.to_thread(self._authenticate, authorization)
        except OpenAIError as error:
            await error_response(error)(scope, receive, send)
            return
        marked = ONLINE_PROJECT.set(principal.project_id)
        try:
            await self.app(scope, receive, send)
        finally:
            ONLINE_PROJECT.reset(marked)

    def _authenticate(self, authorization: str | None) -> Principal:
        with session_scope(self.settings) as session:
            return authenticate(session, self.settings, self.access, authorization)


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        # The worker handles SIGTERM and SIGINT itself (drain, checkpoint, release).
        yield


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the engine starts so that a busy port fails fast."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"overnight worker: cannot listen on {host}:{port}: {exc}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


class OnlineServer:
    """Serves `app` on `sock` and flushes usage, until `stop()`."""

    def __init__(
        self,
        app: Any,
        traffic: OnlineTraffic,
        settings: Settings,
        access: Access,
        sock: socket.socket,
        model: str,
    ) -> None:
        # Outermost, around vLLM's own middleware (its app is already built): the key first.
        guarded = InferenceOnly(MediaScreen(app, MediaRule.of(settings)))
        config = uvicorn.Config(
            ProjectAuth(guarded, settings, access),
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=int(SHUTDOWN_SECONDS),
            **server_options(settings),
        )
        self.server = _Server(config)
        self.traffic = traffic
        self.settings = settings
        self.sock = sock
        self.model = model
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        host, port = self.sock.getsockname()[:2]
        log.info("online API on http://%s:%d/v1 (%s)", host, port, self.model)
        self._tasks = [
            asyncio.create_task(self.server.serve(sockets=[self.sock]), name="online api"),
            asyncio.create_task(self._flush_forever(), name="online usage"),
        ]

    async def stop(self) -> None:
        self.server.should_exit = True
        serving, flushing = self._tasks
        flushing.cancel()
        await asyncio.gather(serving, flushing, return_exceptions=True)
        await self.flush()

    async def _flush_forever(self) -> None:
        while True:
            await asyncio.sleep(USAGE_FLUSH_SECONDS)
            await self.flush()

    async def flush(self) -> None:
        usage = self.traffic.take_usage()
        if not usage:
            return
        try:
            await asyncio.to_thread(self._record, usage)
        except Exception as exc:
            # The database may be away for a while: the counts wait for the next flush.
            log.warning("could not record online usage: %s", exc)
            self.traffic.give_back(usage)

    def _record(self, usage: dict[str, Any]) -> None:
        with session_scope(self.settings) as session:
            online_usage.add(session, self.model, usage)
