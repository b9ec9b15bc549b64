"""The admin dashboard at `/dashboard`: Jinja2 pages plus a little plain JS, no build step."""

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from app.dashboard import feeds, routes
from app.dashboard.auth import COOKIE_PATH, LoginRequired, login_url

STATIC = Path(__file__).parent / "static"


def install_dashboard(app: FastAPI) -> None:
    """Mounts the dashboard's pages, feeds and static files on `app`."""
    app.mount(f"{COOKIE_PATH}/static", StaticFiles(directory=STATIC), name="dashboard-static")
    app.include_router(routes.router)
    app.include_router(feeds.router)

    @app.get("/", include_in_schema=False)
    def root() -> Response:
        return RedirectResponse(COOKIE_PATH)

    @app.exception_handler(LoginRequired)
    async def _login_required(_request: Request, exc: LoginRequired) -> Response:
        return RedirectResponse(login_url(exc.next_url), status_code=303)
