"""Who may use the dashboard: an admin key, given once in a login form and kept in a cookie.

The cookie is HttpOnly and SameSite=Strict; every request re-checks it, so revoking
the key logs its sessions out. With no keys configured the dashboard is open, as the API is.
"""

from typing import Annotated
from urllib.parse import quote

from fastapi import Depends, Request, Response
from sqlalchemy.orm import Session

from app.api.deps import AccessDep, SettingsDep, UnitOfWorkDep
from app.config import Settings
from app.errors import OpenAIError
from app.services.auth import Access, authenticate

COOKIE = "overnight_admin"
COOKIE_PATH = "/dashboard"
# Sent by the dashboard's own scripts on every action: a cross-site form cannot set it.
ACTION_HEADER = "x-overnight-dashboard"


class LoginRequired(Exception):
    """Raised for a page that needs a login; turned into a redirect to the form."""

    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


def is_admin_key(session: Session, settings: Settings, access: Access, key: str | None) -> bool:
    """True for the configured admin key or an unrevoked admin-role key (any key in open mode)."""
    try:
        principal = authenticate(session, settings, access, f"Bearer {key}" if key else None)
    except OpenAIError:
        return False
    return principal.is_admin


def set_login_cookie(response: Response, request: Request, key: str) -> None:
    response.set_cookie(
        COOKIE,
        key,
        httponly=True,
        samesite="strict",
        # The original request's: uvicorn takes X-Forwarded-Proto from trusted proxies
        # (OVERNIGHT_FORWARDED_ALLOW_IPS).
        secure=request.url.scheme == "https",
        path=COOKIE_PATH,
    )


def login_url(next_url: str) -> str:
    return f"{COOKIE_PATH}/login?next={quote(next_url, safe='')}"


def safe_next(next_url: str | None) -> str:
    """Only ever redirect within the dashboard (no open redirect)."""
    if next_url and next_url.startswith(COOKIE_PATH) and not next_url.startswith("//"):
        return next_url
    return COOKIE_PATH


async def require_page_login(
    request: Request, uow: UnitOfWorkDep, settings: SettingsDep, access: AccessDep
) -> None:
    if not await uow.run(is_admin_key, settings, access, request.cookies.get(COOKIE)):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target)


async def require_api_login(
    request: Request, uow: UnitOfWorkDep, settings: SettingsDep, access: AccessDep
) -> None:
    """For the dashboard's JSON feeds and actions: 401 (the page script then shows the form)."""
    if not await uow.run(is_admin_key, settings, access, request.cookies.get(COOKIE)):
        raise OpenAIError("Log in to the dashboard with an admin key.", status_code=401)
    if request.method != "GET" and request.headers.get(ACTION_HEADER) != "1":
        raise OpenAIError("Dashboard actions must come from the dashboard.", status_code=403)


PageLogin = Annotated[None, Depends(require_page_login)]
ApiLogin = Annotated[None, Depends(require_api_login)]
