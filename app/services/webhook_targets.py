"""Where a webhook may be sent: http(s) URLs of public hosts, checked again at every attempt.

A tenant must not make the server probe its own network, so a host that resolves to any
loopback, private, link-local or otherwise non-global address is refused unless
`OVERNIGHT_WEBHOOK_ALLOW_PRIVATE` is set. Delivery connects to the very address it checked
(the `Host` header and TLS name stay the URL's), so a name that changes its answer between
the check and the connection (DNS rebinding) cannot redirect it. The media URLs workers
fetch are judged by the same rule (`app.services.media_urls`).
"""

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

from app.errors import OpenAIError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# The well-known NAT64 prefix (RFC 6052), the IPv4 address in its last 32 bits, and the
# prefix set aside for a network's own translators (RFC 8215).
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
NAT64_LOCAL = ipaddress.IPv6Network("64:ff9b:1::/48")


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
    parts = parse(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = resolve_allowed(host, port, allow_private, "OVERNIGHT_WEBHOOK_ALLOW_PRIVATE")
    first = addresses[0]
    literal = f"[{first}]" if first.version == 6 else str(first)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    host_header = host if parts.port is None else f"{host}:{parts.port}"
    return Target(parts._replace(netloc=netloc).geturl(), host, host_header)


def resolve_allowed(host: str, port: int, allow_private: bool, setting: str) -> list[IPAddress]:
    """Every address `host` resolves to, refused if one is not public unless `allow_private`
    (`setting` names the variable that allows them)."""
    addresses = _resolve(host, port)
    if not allow_private:
        for address in addresses:
            if not is_public(address):
                raise TargetRefused(
                    f"{host} resolves to {address}, a loopback or private address; such "
                    f"targets need {setting}=1 on the server."
                )
    return addresses


def is_public(address: IPAddress) -> bool:
    """Whether `address` is on the public internet. An IPv6 address that carries an IPv4
    one (NAT64, 6to4, IPv4-mapped) reaches that IPv4 address, so that one is judged."""
    if isinstance(address, ipaddress.IPv6Address):
        if address in NAT64_LOCAL:
            return False  # a network's own translator: where it leads cannot be told
        inner = _embedded_ipv4(address)
        if inner is not None:
            return inner.is_global
    return address.is_global


def _embedded_ipv4(address: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address.ipv4_mapped or address.sixtofour


def check_url(url: str, allow_private: bool) -> str:
    """A webhook URL as given, or an OpenAI-style 400 on `url` saying what is wrong."""
    try:
        pin(url, allow_private)
    except TargetRefused as exc:
        raise OpenAIError(f"Invalid 'url': {exc}", param="url", code="invalid_url") from None
    return url


def parse(url: str) -> SplitResult:
    """An http(s) URL with a host and no user name or password, split."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as exc:
        raise TargetRefused(f"{url!r} is not a URL ({exc}).") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused(f"{url!r} is not an http:// or https:// URL with a host.")
    if parts.username or parts.password:
        raise TargetRefused("the URL may not carry a user name or password.")
    return parts


def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:  # UnicodeError: an empty or too long label
        raise TargetRefused(f"{host} does not resolve ({exc}).") from None
    addresses: list[IPAddress] = []
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if address not in addresses:
            addresses.append(address)
    return addresses
