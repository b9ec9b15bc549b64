"""The in-flight window: keeps the engine saturated without holding a batch in memory.

Up to `window` requests run in the engine at once; up to `lookahead` more wait in a pool
from which the next one is picked as soon as any finishes (no chunk barriers). Picking keeps
requests that share a prompt prefix together, so vLLM's prefix cache serves them, and
identical deterministic requests of a batch run once: the others get a copy of the result.
"""

import asyncio
import hashlib
import logging
from collections import OrderedDict, deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from app.endpoints import CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES
from app.ids import new_request_id
from worker.adapters import NO_GROUP, AdapterRule, InFlightAdapters
from worker.engine import Engine
from worker.engine_results import EngineResult

log = logging.getLogger("overnight.worker")

PREFIX_CHARS = 256
RESULT_CACHE_SIZE = 1024


class Sink(Protocol):
    """Where a job's result goes: the shard run that read it."""

    def deliver(self, job: "Job", result: EngineResult, copied: bool) -> None: ...

    def engine_failed(self, error: BaseException) -> None: ...

    async def leased(self) -> bool:
        """Whether a request may go to the engine for the sink, once that is sure (False: the
        sink's run is over, so nothing may)."""


@dataclass(eq=False, slots=True)
class Job:
    """One input line on its way through the engine."""

    sink: Sink | None
    batch_id: str
    endpoint: str
    line: int
    custom_id: str
    body: dict[str, Any]
    request_id: str = field(default_factory=new_request_id)
    prefix: Hashable = None
    adapter: str | None = None  # the LoRA adapter the line names; None: the base model
    key: bytes | None = None
    followers: list["Job"] = field(default_factory=list)
    task: "asyncio.Task[None] | None" = None
    aborted: bool = False
    preempted: bool = False

    @property
    def engine_id(self) -> str:
        return self.request_id.removeprefix("req_")


def is_deterministic(endpoint: str, body: dict[str, Any]) -> bool:
    if endpoint == EMBEDDINGS:
        return True
    temperature = body.get("temperature")
    greedy = type(temperature) in (int, float) and temperature == 0
    return greedy or body.get("seed") is not None


def dedup_key(batch_id: str, endpoint: str, body: dict[str, Any]) -> bytes | None:
    """Equal for requests of one batch that must give the same answer."""
    if not is_deterministic(endpoint, body):
        return None
    try:
        canonical = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None
    digest = hashlib.blake2b(digest_size=16)
    for part in (batch_id.encode(), endpoint.encode(), canonical):
        digest.update(part)
        digest.update(b"\0")
    return digest.digest()


def prefix_key(endpoint: str, body: dict[str, Any], chars: int = PREFIX_CHARS) -> Hashable:
    """A cheap stand-in for the rendered prompt's first `chars` characters."""
    if endpoint == CHAT:
        return _messages_prefix(body.get("messages"), chars)
    if endpoint == RESPONSES:
        # `instructions` become the system message, ahead of the input.
        instructions = body.get("instructions")
        messages = [{"role": "system", "content": instructions}] if instructions else []
        given = body.get("input")
        if isinstance(given, str):
            messages.append({"role": "user", "content": given})
        elif isinstance(given, list):
            messages += given
        return _messages_prefix(messages, chars)  # a bad `input` is the engine's 400 to give
    if endpoint == COMPLETIONS:
        prompt = body.get("prompt")
        return prompt[:chars] if isinstance(prompt, str) else None
    return None


def _messages_prefix(messages: object, chars: int) -> Hashable:
    if not isinstance(messages, list):
        return None
    parts: list[str] = []
    size = 0
    for message in messages:
        if not isinstance(message, dict):
            break
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        parts.append(f"{message.get('role')}:{text}")
        size += len(parts[-1])
        if size >= chars:
            break
    return "\n".join(parts)[:chars]


class Scheduler:
    """Feeds an engine from any number of sinks; one per worker process."""

    def __init__(
        self,
        engine: Engine,
        window: int,
        *,
        lookahead: int | None = None,
        dedup: bool = True,
        prefix_grouping: bool = True,
        adapters: AdapterRule | None = None,
    ) -> None:
        self.engine = engine
        self.window = max(1, window)
        self.lookahead = lookahead or self.window
        self.dedup = dedup
        self.prefix_grouping = prefix_grouping
        # With LoRA: only requests whose adapters may share the engine are in flight together.
        self._adapters = InFlightAdapters(adapters) if adapters is not None else None
        self.failure: BaseException | None = None
        self.output_tokens = 0
        self._groups: OrderedDict[Hashable, deque[Job]] = OrderedDict()
        self._pending = 0
        self._current: Hashable = None
        self._burst = 0
        # In submission order: preemption takes the newest first (the least work lost).
        self._in_flight: dict[Job, None] = {}
        self._leaders: dict[bytes, Job] = {}
        self._results: OrderedDict[bytes, EngineResult] = OrderedDict()
        self._space = asyncio.Event()
        self._space.set()
        self._sinks: set[Sink] = set()

    async def submit(self, job: Job) -> None:
        """Queue a job; waits while the pool is full. Its result goes to `job.sink`."""
        while self._pending >= self.lookahead and self.failure is None:
            self._space.clear()
            await self._space.wait()
        if self.failure is not None:
            raise self.failure
        if job.sink is not None:
            self._sinks.add(job.sink)
        if self.dedup and (key := dedup_key(job.batch_id, job.endpoint, job.body)) is not None:
            if (result := self._results.get(key)) is not None:
                self._results.move_to_end(key)
                if job.sink is not None:
                    job.sink.deliver(job, result, True)
                return
            if (leader := self._leaders.get(key)) is not None:
                leader.followers.append(job)
                return
            job.key = key
            self._leaders[key] = job
        if self.prefix_grouping:
            job.prefix = prefix_key(job.endpoint, job.body)
        if self._adapters is not None:
            job.adapter = self._adapters.rule.adapter_of(job.body)
            job.prefix = (job.adapter, job.prefix)
        self._enqueue(job)
        self._pump()

    def _enqueue(self, job: Job) -> None:
        group = self._groups.get(job.prefix)
        if group is None:
            group = self._groups[job.prefix] = deque()
        group.append(job)
        self._pending += 1

    def _next(self) -> Job | None:
        """The next job to send; None while none may join those in flight (their adapters)."""
        key = self._current
        held = self._adapters is not None and not self._adapters.admits_group(key)
        stale = key not in self._groups or held
        if stale or (self._burst >= self.lookahead and len(self._groups) > 1):
            if not stale:
                # Others waited a whole pool's worth: the current prefix goes to the back.
                self._groups.move_to_end(key)
            key = self._first_admitted()
            if key is NO_GROUP:
                return None
            self._burst = 0
        group = self._groups[key]
        job = group.popleft()
        if not group:
            del self._groups[key]
        self._current = key
        self._burst += 1
        self._pending -= 1
        return job

    def _first_admitted(self) -> Hashable:
        if self._adapters is None:
            return next(iter(self._groups))
        return self._adapters.first_group(self._groups, self._current)

    def _enter(self, job: Job) -> None:
        self._in_flight[job] = None
        if self._adapters is not None:
            self._adapters.enter(job.adapter)

    def _leave(self, job: Job) -> None:
        if job in self._in_flight:
            del self._in_flight[job]
            if self._adapters is not None:
                self._adapters.leave(job.adapter)

    def _pump(self) -> None:
        while self._pending and len(self._in_flight) < self.window and self.failure is None:
            job = self._next()
            if job is None:
                break
            self._enter(job)
            job.task = asyncio.create_task(self._run(job))
        if self._pending < self.lookahead:
            self._space.set()

    async def _run(self, job: Job) -> None:
        try:
            if job.sink is not None and not await job.sink.leased():
                # Its shard's run ended while it waited (a lost lease): nothing goes out.
                self._leave(job)
                self._promote(job)
                self._pump()
                return
            result = await self.engine.run(job.endpoint, job.body, job.engine_id)
        except asyncio.CancelledError:
            self._leave(job)
            self._settle(job, None)
            self._pump()
            raise
        except Exception as exc:
            self._leave(job)
            self._fail(exc)
            return
        self._leave(job)
        self._settle(job, result)
        self._pump()

    def _settle(self, job: Job, result: EngineResult | None) -> None:
        """A run ended with `result` (None: cancelled). A preempted job runs again whatever it
        got: vLLM's serving answers a cancel ("Client disconnected") instead of raising."""
        if job.preempted and not job.aborted:
            self._requeue(job)
        elif result is None:
            self._forget(job)
        else:
            self._complete(job, result)

    def _requeue(self, job: Job) -> None:
        """A preempted job waits again, first in line, under a new request id."""
        job.preempted, job.task = False, None
        job.request_id = new_request_id()
        group = self._groups.get(job.prefix)
        if group is None:
            group = self._groups[job.prefix] = deque()
        group.appendleft(job)
        self._groups.move_to_end(job.prefix, last=False)
        self._pending += 1

    async def resize(self, window: int, preempt: bool = True) -> int:
        """Keep at most `window` requests in flight from now on; returns how many were preempted.

        With `preempt`, the newest requests beyond the new window are aborted in the engine
        and wait again, first in line: an aborted run delivers nothing, so each still gives
        exactly one result, later.
        """
        self.window = max(0, window)
        excess = len(self._in_flight) - self.window
        if excess <= 0 or not preempt:
            self._pump()
            return 0
        victims = [j for j in list(self._in_flight)[-excess:] if j.task and not j.task.done()]
        ids = [job.engine_id for job in victims]
        # Taken now: a requeued job may run again (a new task) before these end.
        tasks = [job.task for job in victims if job.task is not None]
        for job, task in zip(victims, tasks, strict=True):
            job.preempted = True
            task.cancel()
        try:
            await self.engine.abort(ids)
        except Exception:
            log.exception("aborting %d preempted requests in the engine failed", len(ids))
        await asyncio.gather(*tasks, return_exceptions=True)
        return len(victims)

    def _complete(self, job: Job, result: EngineResult) -> None:
        self.output_tokens += result.usage.output_tokens
        if job.aborted:
            # An aborted request may still answer with what it had: never a result.
            self._forget(job)
            return
        if job.key is not None:
            self._forget(job)
            self._results[job.key] = result
            if len(self._results) > RESULT_CACHE_SIZE:
                self._results.popitem(last=False)
        if job.sink is not None:
            job.sink.deliver(job, result, False)
        for follower in job.followers:
            if follower.sink is not None:
                follower.sink.deliver(follower, result, True)

    def _forget(self, job: Job) -> None:
        if job.key is not None and self._leaders.get(job.key) is job:
            del self._leaders[job.key]

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            log.error("the engine failed: %s", error)
            self.failure = error
        self._space.set()
        for sink in list(self._sinks):
            sink.engine_failed(error)

    def _promote(self, job: Job) -> None:
        """A leader left: its first remaining follower runs in its place."""
        self._forget(job)
        if not job.followers:
            return
        heir, *rest = job.followers
        heir.followers, heir.key, heir.prefix = rest, job.key, job.prefix
        heir.adapter = job.adapter
        if heir.key is not None:
            self._leaders[heir.key] = heir
        self._enqueue(heir)

    async def abort(self, sink: Sink) -> int:
        """Drop the sink's waiting jobs and abort its requests in the engine; returns how many."""
        self._sinks.discard(sink)
        for leader in list(self._leaders.values()) + list(self._in_flight):
            leader.followers = [f for f in leader.followers if f.sink is not sink]
        dropped: list[Job] = []
        for key in list(self._groups):
            group = self._groups[key]
            kept = deque(j for j in group if j.sink is not sink)
            dropped.extend(j for j in group if j.sink is sink)
            self._pending -= len(group) - len(kept)
            if kept:
                self._groups[key] = kept
            else:
                del self._groups[key]
        for job in dropped:
            self._promote(job)
        doomed = []
        for job in list(self._in_flight):
            if job.sink is not sink:
                continue
            if job.followers:
                job.sink = None  # others still wait for this answer
            else:
                doomed.append(job)
        if doomed:
            ids = [job.engine_id for job in doomed]
            for job in doomed:
                job.aborted = True
                if job.task is not None:
                    job.task.cancel()
            try:
                await self.engine.abort(ids)
            except Exception:
                # Cancelling the tasks aborts them as well; a dead engine has nothing to stop.
                log.exception("aborting %d requests in the engine failed", len(ids))
            await asyncio.gather(*(j.task for j in doomed if j.task), return_exceptions=True)
        self._pump()
        return len(doomed) + len(dropped)
