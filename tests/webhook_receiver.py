"""A real webhook receiver on loopback, for the webhook tests and the dashboard's."""

import socket
import socketserver
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.harness import free_port, read_http_message, readable


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


@dataclass(frozen=True)
class Stall:
    """How a stalling receiver answers once it has read a request: `head`, then `chunk` every
    `every` seconds until `for_seconds` have passed or the client has gone."""

    head: bytes
    chunk: bytes
    every: float
    for_seconds: float = 60.0


# A status line, then a header one byte at a time: never a complete answer.
DRIP = Stall(b"HTTP/1.1 200 OK\r\nx-drip: ", b"a", every=0.5)
# A 500 whose body never ends: 64 KiB every 0.05 s (a client that reads it all takes in
# 80 MB in the minute it lasts).
FLOOD = Stall(b"HTTP/1.1 500 Oops\r\ncontent-length: 1000000000000\r\n\r\n", b"x" * 65536, 0.05)


@dataclass
class StallingReceiver:
    """A real TCP server on loopback that never finishes an answer (see `Stall`)."""

    url: str = ""
    requests: int = 0
    # The most connections open at once, as the kernel sees them when one arrives: a
    # connection the client has closed counts no more, though the thread answering it may
    # not have run since (on a busy machine it lagged by seconds, and counted it).
    most_open: int = 0
    sent: int = 0  # bytes of answers it got out
    lock: threading.Lock = field(default_factory=threading.Lock)
    sockets: set[socket.socket] = field(default_factory=set)  # the connections it answers

    @property
    def open(self) -> int:
        """How many connections it is answering now."""
        return len(self.sockets)

    def wait_for(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while self.requests < count:
            assert time.monotonic() < deadline, f"{self.requests} of {count} requests"
            time.sleep(0.02)


@contextmanager
def stalling_receiver(stall: Stall = DRIP) -> Iterator[StallingReceiver]:
    state = StallingReceiver()
    stop = threading.Event()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            with state.lock:
                state.sockets.add(self.request)
                live = sum(1 for sock in state.sockets if not _closed_by_client(sock))
                state.most_open = max(state.most_open, live)
            try:
                read_http_message(self.request)
                with state.lock:
                    state.requests += 1
                self._stall(self.request)
            except OSError:
                pass  # the client hung up
            finally:
                with state.lock:
                    state.sockets.discard(self.request)

        def _stall(self, sock: socket.socket) -> None:
            self._send(sock, stall.head)
            ends = time.monotonic() + stall.for_seconds
            while time.monotonic() < ends and not stop.is_set():
                if readable(sock, stall.every) and not sock.recv(1):
                    return  # the client closed its side
                self._send(sock, stall.chunk)

        def _send(self, sock: socket.socket, data: bytes) -> None:
            sock.sendall(data)
            with state.lock:
                state.sent += len(data)

    server = socketserver.ThreadingTCPServer(("127.0.0.1", free_port()), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    try:
        yield state
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


def _closed_by_client(sock: socket.socket) -> bool:
    """The client's end is closed: its FIN waits unread (bytes it sent unread mean open)."""
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
