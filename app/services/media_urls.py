"""Which media URLs a request may make a worker fetch.

vLLM downloads a request's `image_url`, `audio_url`, `video_url` (content parts of chat,
responses and pooling requests) and `file_url` (transcriptions) from the worker, wherever
the worker stands: beside cloud metadata, the database, the store's console. So an http(s)
media URL is refused unless the operator allows its host (`OVERNIGHT_ALLOWED_MEDIA_DOMAINS`,
`"*"` for any host) and, even then, when the host resolves to a loopback, private or
link-local address (the webhook rule, `webhook_targets`) unless
`OVERNIGHT_MEDIA_ALLOW_PRIVATE` is set. A `data:` URL carries its bytes and is always fine.
vLLM fetches no other scheme over the network (it refuses them, or reads `file:` only under
the operator's `--allowed-local-media-path`), so those are left to it.
"""

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.config import Settings
from app.services.webhook_targets import TargetRefused, parse, resolve_allowed

MEDIA_KEYS = frozenset({"image_url", "audio_url", "video_url", "file_url"})
# A Messages (`/v1/messages`) image block's source, which vLLM turns into an `image_url`.
ANTHROPIC_SOURCE_KEY = "source"
ANY_HOST = "*"
REFUSED_CODE = "media_url_not_allowed"
ALLOW_PRIVATE_SETTING = "OVERNIGHT_MEDIA_ALLOW_PRIVATE"
# Printable ASCII but the space and the backslash: parsers disagree on the host of a URL
# with anything else in it (vLLM's urllib3 and aiohttp, Python's urlsplit), so such a URL
# is refused rather than judged by one of them.
_PLAIN_URL = re.compile(r"[!-\[\]-~]+")
# A host name or IPv4 address, or an IPv6 address (its brackets removed): no zone, no escape.
_PLAIN_HOST = re.compile(r"[a-z0-9.-]+|[0-9a-f:.]+")


@dataclass(frozen=True)
class MediaRefusal:
    param: str  # where the URL is in the body, e.g. `messages[0].content[1].image_url`
    message: str


def media_urls(body: object) -> list[tuple[str, str]]:
    """Each media URL in a request body, with where it is, as vLLM reads them: a media key's
    string, or the `url` of its object."""
    found: list[tuple[str, str]] = []
    # Not recursive: a body may nest as deeply as JSON allows.
    stack: list[tuple[str, dict[str, object] | list[object]]] = []
    if isinstance(body, dict | list):
        stack.append(("", body))
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            url = _media_url(key, value)
            if url is not None:
                found.append((_join(path, key), url))
            elif isinstance(value, dict | list):
                stack.append((_join(path, key), value))
    return found


def _media_url(key: str | int, value: object) -> str | None:
    if key not in MEDIA_KEYS and not _url_source(key, value):
        return None
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


def _url_source(key: str | int, value: object) -> bool:
    """Anthropic's `"source": {"type": "url", "url": …}`."""
    return key == ANTHROPIC_SOURCE_KEY and isinstance(value, dict) and value.get("type") == "url"


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


@dataclass
class MediaRule:
    """A deployment's allowance for media URLs.

    `remember` keeps each host's verdict: for one file's validation, never for a worker,
    which judges every request afresh (a host's addresses may change meanwhile).
    """

    domains: frozenset[str]
    allow_private: bool
    remember: bool = False
    _verdicts: dict[tuple[str, int], str | None] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, settings: Settings, remember: bool = False) -> "MediaRule":
        domains = frozenset(d.lower() for d in settings.allowed_media_domains)
        return cls(domains, settings.media_allow_private, remember)

    def vllm_domains(self) -> list[str] | None:
        """vLLM's `--allowed-media-domains`. None: vLLM fetches from any host, which it also
        does for an empty list; overnight's own check then refuses what is not allowed."""
        if ANY_HOST in self.domains or not self.domains:
            return None
        return sorted(self.domains)

    def first_refusal(self, urls: Iterable[tuple[str, str]]) -> MediaRefusal | None:
        """The first of `media_urls` a worker may not fetch; resolves host names (blocking)."""
        for param, url in urls:
            reason = self.refusal(url)
            if reason is not None:
                return MediaRefusal(param, f"The media URL {_show(url)} is refused: {reason}")
        return None

    def refusal(self, url: str) -> str | None:
        """Why a worker may not fetch `url`; None when it may, or fetches no such URL."""
        # Over-inclusive on purpose: whatever a parser could read as http(s) is judged.
        if "http" not in url.partition(":")[0].lower():
            return None
        if not _PLAIN_URL.fullmatch(url):
            return "it may hold only printable ASCII, no space or backslash (percent-encode them)."
        try:
            parts = parse(url)
        except TargetRefused as exc:
            return str(exc)
        host = parts.hostname or ""
        if not _PLAIN_HOST.fullmatch(host):
            return f"its host {host!r} is neither a plain name nor an IP address."
        if ANY_HOST not in self.domains and host not in self.domains:
            return self._unlisted(host)
        if self.allow_private:
            return None  # any address will do: nothing to resolve
        return self._address_refusal(host, parts.port or (443 if parts.scheme == "https" else 80))

    def _unlisted(self, host: str) -> str:
        if not self.domains:
            return (
                "this deployment fetches no remote media; send the bytes as a data: URL (an "
                "operator allows hosts with OVERNIGHT_ALLOWED_MEDIA_DOMAINS)."
            )
        listed = ", ".join(sorted(self.domains))
        return (
            f"{host} is not a host this deployment fetches media from ({listed}); send the "
            "bytes as a data: URL, or ask the operator to add the host to "
            "OVERNIGHT_ALLOWED_MEDIA_DOMAINS."
        )

    def _address_refusal(self, host: str, port: int) -> str | None:
        if (host, port) in self._verdicts:
            return self._verdicts[(host, port)]
        try:
            resolve_allowed(host, port, self.allow_private, ALLOW_PRIVATE_SETTING)
            verdict = None
        except TargetRefused as exc:
            verdict = str(exc)
        if self.remember:
            self._verdicts[(host, port)] = verdict
        return verdict


def _show(url: str, limit: int = 80) -> str:
    return repr(url if len(url) <= limit else url[:limit] + "…")
