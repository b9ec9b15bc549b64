"""A scripted engine with `worker.engine.Engine`'s interface, and a worker run in a thread.

It answers `/v1/chat/completions` and, in Anthropic's `message` shape, `/v1/messages`.

For fast tests of the scheduling, checkpoint and lease logic only: every end-to-end path is
also tested against the real vLLM engine (tests/test_worker_engine.py).
"""

import asyncio
import threading
from collections.abc import Iterable
from typing import Any

from app.config import Settings
from app.core.progress import Usage
from app.endpoints import CHAT, MESSAGES
from worker.engine_gauges import EngineStats
from worker.engine_results import EngineResult, error_result
from worker.loop import Worker, WorkerOptions

MODEL = "SmolLM2-135M-Instruct"


class FakeEngine:
    """Answers after `delay` seconds (a body's `"delay"` overrides it) with the last message
    reversed."""

    def __init__(
        self, delay: float = 0.01, max_num_seqs: int = 4, served_names: list[str] | None = None
    ) -> None:
        self.delay = delay
        self.max_num_seqs = max_num_seqs
        self.served_names = served_names or [MODEL]
        self.calls: list[tuple[str, dict[str, Any], str]] = []
        self.aborted: list[str] = []
        self.running = 0
        self.peak = 0
        self.configuration: dict[str, Any] = {
            "effective": {"model": "fake", "max_num_seqs": max_num_seqs},
            "arguments": {"delay": delay},
        }

    async def run(self, endpoint: str, body: dict[str, Any], request_id: str) -> EngineResult:
        self.calls.append((endpoint, body, request_id))
        self.running += 1
        self.peak = max(self.peak, self.running)
        try:
            await asyncio.sleep(float(body.get("delay", self.delay)))
        except asyncio.CancelledError:
            # As vLLM's serving objects do: a cancelled request is answered, not raised.
            return error_result(400, "Client disconnected")
        finally:
            self.running -= 1
        if body.get("stream"):
            return error_result(400, "Streaming is not supported in batch requests.", "stream")
        if "messages" not in body:
            return error_result(400, "1 validation error: messages: Field required", "messages")
        text = str(body["messages"][-1].get("content", ""))[::-1]
        if endpoint == MESSAGES:
            return _message(body, request_id, text)
        usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
        answer = {
            "id": f"chatcmpl-{request_id}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
            "usage": usage,
        }
        return EngineResult(200, answer, Usage(input_tokens=3, output_tokens=2))

    def stats(self) -> EngineStats:
        """As a scheduler with `max_num_seqs` slots sees its requests; the cache fills with them."""
        running = min(self.running, self.max_num_seqs)
        return EngineStats(running, self.running - running, running / self.max_num_seqs)

    async def abort(self, request_ids: Iterable[str]) -> None:
        self.aborted.extend(request_ids)

    def bodies(self) -> list[dict[str, Any]]:
        return [body for endpoint, body, _ in self.calls if endpoint == CHAT]


def _message(body: dict[str, Any], request_id: str, text: str) -> EngineResult:
    """As Anthropic's Messages API answers (and vLLM's serving class for it)."""
    if "max_tokens" not in body:
        return error_result(400, "1 validation error: max_tokens: Field required")
    message = {
        "id": f"chatcmpl-{request_id}",
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    return EngineResult(200, message, Usage(input_tokens=3, output_tokens=2))


class ThreadedWorker:
    """A real `Worker` on its own event loop in a thread, fed by a fake engine."""

    def __init__(self, settings: Settings, engine: FakeEngine, **options: Any) -> None:
        self.settings = settings
        self.engine = engine
        self.options = WorkerOptions(worker_id=options.pop("worker_id", "fake-worker"), **options)
        self.exit_code: int | None = None
        self.worker: Worker | None = None
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self.exit_code = self._loop.run_until_complete(self._serve())

    async def _serve(self) -> int:
        self._stop = asyncio.Event()
        self.worker = Worker(self.settings, self.engine, self.options)
        self._ready.set()
        return await self.worker.run(self._stop)

    def __enter__(self) -> "ThreadedWorker":
        self._thread.start()
        self._ready.wait(10)
        return self

    def stop(self, timeout: float = 30) -> None:
        if self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout)

    def __exit__(self, *exc: object) -> None:
        self.stop()


def fast(settings: Settings, **update: Any) -> Settings:
    """Settings with short timers, so lease and checkpoint paths run in a test's time."""
    values = {
        "worker_checkpoint_seconds": 0.1,
        "worker_poll_seconds": 0.1,
        "worker_drain_seconds": 1.0,
        "lease_seconds": 3.0,
        "housekeeping_interval_seconds": 0.2,
        **update,
    }
    return settings.model_copy(update=values)
