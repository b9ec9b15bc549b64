"""A local HTTP file server for tests: GET what `Files.served` holds (or a redirect from
`Files.redirects`), PUT into `Files.received`; every GET's path is kept in `Files.requested`."""

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar


class Files(http.server.BaseHTTPRequestHandler):
    """GET serves `served` or redirects by `redirects`; PUT stores the body in `received`."""

    served: ClassVar[dict[str, bytes]] = {}
    received: ClassVar[dict[str, bytes]] = {}
    redirects: ClassVar[dict[str, str]] = {}  # path -> the URL it redirects to (302)
    requested: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requested.append(self.path)
        if (location := self.redirects.get(self.path)) is not None:
            self.send_response(302)
            self.send_header("Location", location)
            self.end_headers()
            return
        body = self.served.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"")

    def do_PUT(self) -> None:
        chunks = []
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            while size := int(self.rfile.readline().strip(), 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            self.rfile.readline()
        else:
            chunks.append(self.rfile.read(int(self.headers.get("content-length", 0))))
        self.received[self.path] = b"".join(chunks)
        self.send_response(201)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def serving_files() -> Iterator[str]:
    """`Files` on a loopback port, in a thread; yields its base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Files)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
