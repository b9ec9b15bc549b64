"""Where a webhook may be sent: http(s) URLs of public hosts, checked again at every attempt.

A tenant must not make the server probe its own network, so a host that resolves to any
loopback, private, link-local or otherwise non-global address is refused unless
`OVERNIGHT_WEBHOOK_ALLOW_PRIVATE` is set. Delivery connects to the very address it checked
(the `Host` header and TLS name stay the URL's), so a name that changes its answer between
the check and the connection (DNS rebinding) cannot redirect it.
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from app.errors import OpenAIError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class TargetRefused(Exception):
    """The URL may not be delivered to; the message says why."""


@dataclass(frozen=True)
class Target:
    """A URL pinned to one checked address."""

    url: str  # the URL with its host replaced by the checked address
    host: str  # the URL's own host name, for TLS (SNI and the certificate check)
    host_header: str  # the URL's own host[:port]


def pin(url: str, allow_private: bool) -> Target:
    """The URL to connect to, after checking every address its host resolves to."""
    parts = _parse(url)
    host = parts.hostname or ""
    addresses = _resolve(host, parts.port or (443 if parts.scheme == "https" else 80))
    if not allow_private:
        for address in addresses:
            if not address.is_global:
                raise TargetRefused(
                    f"{host} resolves to {address}, a loopback or private address; such "
                    "targets need OVERNIGHT_WEBHOOK_ALLOW_PRIVATE=1 on the server."
                )
    first = addresses[0]
    literal = f"[{first}]" if first.version == 6 else str(first)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return Target(parts._replace(netloc=netloc).geturl(), host, host_header)


def check_url(url: str, allow_private: bool) -> str:
    """A webhook URL as given, or an OpenAI-style 400 on `url` saying what is wrong."""
    try:
        pin(url, allow_private)
    except TargetRefused as exc:
        raise OpenAIError(f"Invalid 'url': {exc}", param="url", code="invalid_url") from None
    return url


def _parse(url: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise TargetRefused(f"{url!r} is not a URL ({exc}).") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url!r} is not an http:// or https:// URL with a host.")
    if parts.username or parts.password:
        raise TargetRefused("a webhook URL may not carry a user name or password.")
    return parts


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise TargetRefused(f"{host} does not resolve ({exc}).") from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses
