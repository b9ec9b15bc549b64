"""While the API is open, what a web page in the operator's browser sends is refused.

Open mode lets in whoever reaches the port, and listens on loopback for that; but a
browser on the same machine reaches loopback too. Any page can post a form or a `no-cors`
fetch to it (the answer stays hidden, the side effect happens), or point its own name at
127.0.0.1 (DNS rebinding) and then read the answers as its own. So while the API is open:

- the `Host` must be loopback, an IP address (rebinding needs a name), `OVERNIGHT_HOST` or
  a name in `OVERNIGHT_ALLOWED_HOSTS`;
- a state-changing request from another origin (`Origin`, `Sec-Fetch-Site`) is refused;
- a JSON endpoint takes a body only as `application/json`, which no page can send to
  another origin without a CORS preflight, and this server grants none.

Keyed mode is left as it was: a page has no key to send.
"""

import ipaddress
import re
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.unit_of_work import UnitOfWork
from app.config import Settings
from app.db.session import read_session_factory
from app.errors import OpenAIError
from app.http_errors import error_response
from app.services.auth import Access

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# The /v1 routes that take a multipart form; every other /v1 body is JSON.
MULTIPART_PATHS = re.compile(r"/v1/(files|uploads/[^/]+/parts)")
DEFAULT_PORTS = {"http": 80, "https": 443}
WHY = "No API keys are configured, so this server refuses what a web page could send"
FIX = "or create an API key (`overnight keys create --role admin`)"

# A host name and its port, None for the scheme's default.
Authority = tuple[str, int | None]


def _authority(scheme: str, netloc: str) -> Authority | None:
    """`netloc` as (name, port); None if it is not a plain host[:port]."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port
    except ValueError:
        return None
    if parts.netloc != netloc or "@" in netloc or not parts.hostname:
        return None
    return parts.hostname.rstrip("."), None if port == DEFAULT_PORTS.get(scheme) else port


def _origin_authority(origin: str) -> Authority | None:
    """An `Origin` header's host and port; None for `null` or anything malformed."""
    parts = urlsplit(origin)
    if parts.scheme not in DEFAULT_PORTS or parts.path or parts.query:
        return None
    return _authority(parts.scheme, parts.netloc)


def _is_ip_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _has_body(headers: Headers) -> bool:
    length = headers.get("content-length")
    return "transfer-encoding" in headers or (length is not None and length.strip() != "0")


def host_refused(host: str) -> OpenAIError:
    return OpenAIError(
        f"Requests for host {host!r} are refused. {WHY}: it answers only requests addressed "
        "to localhost, an IP address, OVERNIGHT_HOST or a name in OVERNIGHT_ALLOWED_HOSTS "
        "(a page could otherwise reach it through DNS rebinding). Add the name to "
        f"OVERNIGHT_ALLOWED_HOSTS (a JSON list), {FIX}.",
        status_code=403,
        code="host_not_allowed",
    )


def cross_origin_refused(source: str) -> OpenAIError:
    return OpenAIError(
        f"Cross-origin request refused: it comes from {source}, not from this server's own "
        f"pages. {WHY}: a request that changes anything must come from the same origin. "
        f"To trust another origin's pages, add its host to OVERNIGHT_ALLOWED_HOSTS, {FIX}.",
        status_code=403,
        code="cross_origin_request",
    )


def media_type_refused(media_type: str) -> OpenAIError:
    return OpenAIError(
        f"Content-Type {media_type or '(none)'} is refused for a JSON body. {WHY}: a JSON "
        "endpoint takes a body only as Content-Type: application/json, which a page cannot "
        "send to another site (curl: -H 'Content-Type: application/json'). To have curl's "
        f"default form type accepted too, {FIX.removeprefix('or ')}.",
        status_code=415,
        code="unsupported_media_type",
    )


class BrowserGuard:
    """Which requests an open API refuses, from the request's head alone."""

    def __init__(self, settings: Settings) -> None:
        self.trusted_names = {name.lower().rstrip(".") for name in settings.allowed_hosts}
        self.host_names = self.trusted_names | {settings.host.lower()}

    def refusal(self, scope: Scope) -> OpenAIError | None:
        headers = Headers(scope=scope)
        host = headers.get("host")
        own = _authority(scope["scheme"], host) if host is not None else None
        if host is not None and (own is None or not self._host_allowed(own[0])):
            return host_refused(host)
        if scope["method"] in SAFE_METHODS:
            return None
        return self._cross_origin(headers, own) or self._not_json(scope["path"], headers)

    def _host_allowed(self, name: str) -> bool:
        loopback_name = name == "localhost" or name.endswith(".localhost")
        return loopback_name or _is_ip_address(name) or name in self.host_names

    def _cross_origin(self, headers: Headers, own: Authority | None) -> OpenAIError | None:
        origin = headers.get("origin")
        if origin is not None:
            theirs = _origin_authority(origin)
            if theirs is None or (theirs != own and theirs[0] not in self.trusted_names):
                return cross_origin_refused(f"Origin {origin}")
        if headers.get("sec-fetch-site") == "cross-site":
            return cross_origin_refused("another site (Sec-Fetch-Site: cross-site)")
        return None

    @staticmethod
    def _not_json(path: str, headers: Headers) -> OpenAIError | None:
        if not path.startswith("/v1/") or MULTIPART_PATHS.fullmatch(path):
            return None
        media_type = headers.get("content-type", "").split(";")[0].strip().lower()
        if media_type == "application/json" or not _has_body(headers):
            return None
        return media_type_refused(media_type)


class BrowserGuardMiddleware:
    """Answers a refused request before any route sees it, while the API is open."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.guard = BrowserGuard(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            access: Access = scope["app"].state.access
            error = self.guard.refusal(scope) if access.seen_open else None
            if error is not None and await self._open_now(access):
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _open_now(self, access: Access) -> bool:
        """Asked before refusing only: once a key exists anywhere, callers pass as in keyed
        mode, though this process has not served a keyless request since."""
        sessions = read_session_factory(self.settings.sqlalchemy_url)
        with sessions(autobegin=False) as session:
            return await UnitOfWork(session).run(access.recheck_open, self.settings)
