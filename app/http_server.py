"""How uvicorn serves the API: connection timeouts that uvicorn does not have by default,
and which proxies it believes about the original request's scheme and client.

uvicorn closes an idle keep-alive connection, but a client that connects and sends
nothing, or trickles its request line and headers a byte at a time, keeps its
connection for ever. The protocol here closes any connection whose request head is not
complete `header_timeout_seconds` after its first byte (or after connecting). Bodies
are timed by `BodyTimeoutMiddleware`.
"""

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from app.config import Settings


class HeaderTimeoutProtocol(HttpToolsProtocol):
    header_timeout_seconds = 10.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream server's protocol is handed a stream transport, as uvicorn's expects.
        super().connection_made(cast(asyncio.Transport, transport))
        self._header_timer: asyncio.TimerHandle | None = None
        self._arm_header_timer()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._cancel_header_timer()
        super().on_headers_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_seconds, self._too_slow)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _too_slow(self) -> None:
        if not self.transport.is_closing():
            self.transport.close()


def server_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.run` / `uvicorn.Config` beyond the app, host and port."""
    protocol = type(
        "HeaderTimeoutProtocol",
        (HeaderTimeoutProtocol,),
        {"header_timeout_seconds": settings.header_timeout_seconds},
    )
    return {
        "http": protocol,
        "timeout_keep_alive": 5,
        "proxy_headers": True,
        "forwarded_allow_ips": settings.forwarded_allow_ips,
    }
