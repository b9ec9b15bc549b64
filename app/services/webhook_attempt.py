"""One webhook attempt: a signed POST that ends by its deadline, whatever the receiver does.

The deadline (`webhook_timeout_seconds`) covers all of it: the host's lookup, connecting,
sending, the answer's status line and headers, and the start of a failure's body (for its
error message), of which at most `RESPONSE_BYTES` are read. A receiver that answers a byte
at a time, or never, costs one slot of its endpoint's for that long and no more.
"""

import asyncio
import functools
import ssl
import time
from dataclasses import dataclass, field

import httpx

from app.config import Settings
from app.core import webhook_signing
from app.services.webhook_senders import senders
from app.services.webhook_targets import TargetRefused, pin

RESPONSE_BYTES = 64 * 1024
_ERROR_CHARS = 500


@dataclass(frozen=True)
class Due:
    """A delivery to attempt: what to send, to which endpoint at which URL, signed with what."""

    id: str
    endpoint_id: str
    url: str
    body: str
    signing_secrets: list[str]


@dataclass(frozen=True)
class Attempt:
    status_code: int | None
    error: str | None
    latency_ms: float

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


@dataclass
class _Answer:
    """What the receiver has answered so far."""

    status_code: int | None = None
    body: bytearray = field(default_factory=bytearray)


async def send(settings: Settings, due: Due, deadline: float | None = None) -> Attempt:
    """The attempt, ended by `deadline` (the event loop's clock; by default
    `webhook_timeout_seconds` from now); a status that came in time counts even if the
    body it began did not."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settings.webhook_timeout_seconds if deadline is None else deadline
    start, answer = time.monotonic(), _Answer()
    failure = None
    try:
        async with asyncio.timeout_at(deadline):
            await _post(settings, due, answer)
    except TimeoutError:
        failure = f"TimeoutError: no answer within {settings.webhook_timeout_seconds:g} s"
    except (TargetRefused, httpx.HTTPError) as exc:
        failure = _describe(exc)
    return _judge(answer, failure, _ms_since(start))


async def _post(settings: Settings, due: Due, answer: _Answer) -> None:
    """POSTs to the checked address of the URL's host, filling `answer` in as it comes."""
    target = await senders(settings).in_thread(pin, due.url, settings.webhook_allow_private)
    body = due.body.encode()
    headers = {
        **webhook_signing.headers(due.signing_secrets, due.id, int(time.time()), body),
        "accept-encoding": "identity",  # a compressed body could grow past the cap
        "content-type": "application/json",
        "host": target.host_header,
        "user-agent": "overnight-webhooks",
    }
    # No timeouts of httpx's own: the caller's deadline bounds the whole exchange. A client
    # per attempt, so that no connection verified for one host name carries another's.
    async with (
        httpx.AsyncClient(timeout=None, verify=_tls()) as http,
        http.stream(
            "POST",
            target.url,
            content=body,
            headers=headers,
            extensions={"sni_hostname": target.host},
        ) as response,
    ):
        answer.status_code = response.status_code
        if not response.is_success:
            await _read_start(response, answer.body)


async def _read_start(response: httpx.Response, into: bytearray) -> None:
    """Appends the body's first `RESPONSE_BYTES` to `into`, and reads no further."""
    async for chunk in response.aiter_raw():
        into += chunk[: RESPONSE_BYTES - len(into)]
        if len(into) >= RESPONSE_BYTES:
            return


@functools.cache
def _tls() -> ssl.SSLContext:
    """httpx's default context, made once: making it (loading the CA bundle) costs more CPU
    than the rest of an attempt, on the event loop that serves the API."""
    return httpx.create_ssl_context()


def _judge(answer: _Answer, failure: str | None, latency_ms: float) -> Attempt:
    code = answer.status_code
    if code is None:
        return Attempt(None, failure or "no answer", latency_ms)
    if 200 <= code < 300:
        return Attempt(code, None, latency_ms)
    text = answer.body.decode(errors="replace")[:_ERROR_CHARS]
    return Attempt(code, f"HTTP {code}: {text}".strip(), latency_ms)


def _describe(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, TargetRefused) else f"{type(exc).__name__}: {text}"


def _ms_since(start: float) -> float:
    return round((time.monotonic() - start) * 1000, 1)
