"""A real webhook receiver on loopback, for the webhook tests and the dashboard's."""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harness import free_port


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float


@dataclass
class Receiver:
    """A real HTTP server on loopback. `answer(n)` says what the n-th request (1-based) gets:
    a status code, or a number of seconds to hang before answering 200."""

    answer: Callable[[int], int | float] = lambda _n: 200
    received: list[Received] = field(default_factory=list)
    url: str = ""

    def wait_for(self, count: int, timeout: float = 30) -> list[Received]:
        deadline = time.monotonic() + timeout
        while len(self.received) < count:
            assert time.monotonic() < deadline, f"{len(self.received)} of {count} deliveries"
            time.sleep(0.05)
        return self.received


@contextmanager
def running_receiver() -> Iterator[Receiver]:
    state = Receiver()
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            with lock:
                state.received.append(Received(dict(self.headers), body, time.time()))
                answer = state.answer(len(state.received))
            if isinstance(answer, float):
                time.sleep(answer)
                answer = 200
            self.send_response(answer)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()
