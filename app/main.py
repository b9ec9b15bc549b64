"""The FastAPI application: OpenAI's Files, Uploads and Batches under `/v1`."""

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import Message, Receive, Scope, Send

from app.api.body import BodyTimeoutMiddleware
from app.api.browser_guard import BrowserGuardMiddleware
from app.api.error_handlers import install_error_handlers
from app.api.nul_bytes import RejectNulMiddleware
from app.api.openapi import OpenAIStyleAPI
from app.api.routes import (
    admin,
    batches,
    files,
    health,
    message_batches,
    models,
    uploads,
    webhooks,
)
from app.asgi import HttpMiddleware
from app.config import Settings, get_settings
from app.dashboard import install_dashboard
from app.db.session import session_scope, upgrade
from app.ids import new_request_id
from app.logging import AccessLogMiddleware
from app.metrics import install_metrics
from app.services.auth import DEFAULT_PROJECT, Access, ensure_project
from app.services.housekeeping import housekeeping_loop
from app.services.principal_cache import PrincipalCache
from app.services.stats import StatsReader
from app.version import __version__

log = logging.getLogger("overnight.api")

# Long-running loops the API process runs beside the routes (housekeeping, validation).
BackgroundLoop = Callable[[Settings, asyncio.Event], Coroutine[Any, Any, None]]
BACKGROUND_LOOPS: list[BackgroundLoop] = [housekeeping_loop]


class RequestIdMiddleware(HttpMiddleware):
    """Puts an `x-request-id` on every response, errors included."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        request_id = new_request_id()
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"].append((b"x-request-id", request_id.encode()))
            await send(message)

        await self.app(scope, receive, send_with_id)


def prepare_database(settings: Settings) -> Access:
    """Newest schema and the open-mode project (so that reading requests never write);
    returns whether the API starts open."""
    upgrade(settings.sqlalchemy_url)
    with session_scope(settings) as session:
        ensure_project(session, DEFAULT_PROJECT)
        return Access.at_startup(session, settings)


def create_app(settings: Settings | None = None, access: Access | None = None) -> FastAPI:
    """The app; `access` is decided at start-up unless the caller already decided it."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        decided = await asyncio.to_thread(prepare_database, settings)
        app.state.access = access or decided
        log.info(
            "access: %s",
            "open (no API keys)" if app.state.access.started_open else "API keys required",
        )
        stop = asyncio.Event()
        tasks = [asyncio.create_task(loop(settings, stop)) for loop in BACKGROUND_LOOPS]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    app = OpenAIStyleAPI(
        title="overnight",
        version=__version__,
        summary="A self-hosted OpenAI Batch API running on an embedded vLLM engine.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.principals = PrincipalCache(settings.auth_cache_seconds)
    app.state.stats = StatsReader(settings)
    install_error_handlers(app)
    for module in (files, uploads, batches, message_batches, models, admin, webhooks):
        app.include_router(module.router, prefix="/v1")
    app.include_router(health.router)
    install_dashboard(app)
    install_metrics(app, settings, app.state.stats)
    app.add_middleware(RejectNulMiddleware)
    app.add_middleware(BrowserGuardMiddleware, settings=settings)
    app.add_middleware(BodyTimeoutMiddleware, idle_seconds=settings.body_idle_timeout_seconds)
    app.add_middleware(AccessLogMiddleware)
    app.add_middleware(RequestIdMiddleware)
    return app


def app_factory() -> Any:
    """Entry point for `uvicorn --factory app.main:app_factory`."""
    return create_app()
