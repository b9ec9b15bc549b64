"""A worker serving several models with one engine slot, switching by demand.

`overnight worker --models A,B,C` holds one model at a time. It starts with the model whose
queued work comes first under the scheduler's rules (`worker.claim.models_with_work`: batches
at risk of missing their deadline, then fair share, then age; the first listed if none has
work) and works as any worker does. Every second it looks again, and leaves the held model
when another model's work comes first and either the held model has nothing left to claim,
or it has been held for its residency: at least `--min-residency` seconds, and four times
what loading the next model last cost, so that switching takes at most a fifth of the time.
It never leaves in the middle of a shard: it stops claiming, finishes the shards it holds,
then switches (`worker.engine_slot`: vLLM's sleep mode where the platform has it, else a
restart). Its `workers` row announces every model it may hold, so batches for any of them
are accepted while another is loaded. A model whose engine fails to start (out of memory,
broken weights) is paused for five minutes while the others are served: its batches wait.
"""

import argparse
import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from app.config import Settings
from app.core.switching import SwitchRule, load_cost
from app.db.session import one_statement_scope, upgrade
from app.schemas.models import ANNOUNCEMENT_KEY, SWITCHING_KEY, Announcement, StandbyModel
from worker.claim import models_with_work
from worker.engine import VllmEngine
from worker.engine_slot import EngineSlot
from worker.health import Health, HealthState
from worker.loop import Worker, WorkerOptions
from worker.outage import until_database
from worker.registry import LoadingBeat

log = logging.getLogger("overnight.worker")

# How often the worker looks whether another model's work should come first.
DEMAND_POLL_SECONDS = 1.0
# A model whose engine failed to start is not tried again for this long.
FAILED_LOAD_PAUSE_SECONDS = 300.0


@dataclass
class Switches:
    """What switching has cost so far, as the worker's row shows it."""

    models: list[str]
    min_residency: float
    load_seconds: dict[str, float] = field(default_factory=dict)
    count: int = 0
    seconds: float = 0.0

    def cost_of(self, model: str) -> float:
        return load_cost(self.load_seconds, model)

    def shown(self, holding: str) -> dict[str, Any]:
        return {
            "models": self.models,
            "holding": holding,
            "min_residency": self.min_residency,
            "load_seconds": {m: round(s, 2) for m, s in self.load_seconds.items()},
            "switches": self.count,
            "switch_seconds": round(self.seconds, 2),
        }


class Switcher:
    def __init__(
        self,
        settings: Settings,
        choices: dict[str, argparse.Namespace],
        options: WorkerOptions,
        health: Health,
        rule: SwitchRule,
        sleep_level: int | None = None,
    ) -> None:
        """`choices`: each model's engine arguments, by the name batches use for it."""
        self.settings, self.choices, self.options = settings, choices, options
        self.health, self.rule = health, rule
        self.slot = EngineSlot(sleep_level)
        self.switches = Switches(list(choices), rule.min_residency)
        self._endpoints: dict[str, list[str]] = {}
        self._next: str | None = None
        self._paused: dict[str, float] = {}  # model → until when it is not tried (monotonic)
        self._last_held: str | None = None

    async def run(self, stop: asyncio.Event) -> int:
        if not await until_database(self.health, stop, upgrade, self.settings.sqlalchemy_url):
            self.health.set(HealthState.STOPPED)
            return 0
        held = await self._first(self._servable()[0])
        try:
            while not stop.is_set():
                try:
                    engine = await self._hold(held)
                except Exception as exc:  # whatever vLLM raises for an engine that cannot start
                    if not self._pause(held, exc):
                        return 1
                    held = await self._first(self._servable()[0])
                    continue
                code = await self._work(engine, held, stop)
                if code or stop.is_set():
                    return code
                held = await self._first(self._next or held)
            return 0
        finally:
            await self.slot.close()

    async def _first(self, otherwise: str) -> str:
        """The model whose work comes first; `otherwise` when none has work, or while the
        database is away (the worker waits the outage out once it works)."""
        try:
            queued = await asyncio.to_thread(self._queued)
        except Exception as exc:
            log.warning("could not read the models' queues: %s", exc)
            return otherwise
        return queued[0] if queued else otherwise

    def _servable(self) -> list[str]:
        """The models not paused after a failed start."""
        now = time.monotonic()
        return [m for m in self.choices if self._paused.get(m, 0.0) <= now]

    def _pause(self, model: str, error: Exception) -> bool:
        """A model whose engine failed to start is not tried again for a while: its batches
        wait, the other models are served. False when no model is left to serve."""
        log.error(
            "could not load %s (%s): serving the other models, %s again in %.0f s",
            model,
            error,
            model,
            FAILED_LOAD_PAUSE_SECONDS,
            exc_info=error,
        )
        self._paused[model] = time.monotonic() + FAILED_LOAD_PAUSE_SECONDS
        return bool(self._servable())

    def _queued(self) -> list[str]:
        with one_statement_scope(self.settings) as session:
            return models_with_work(
                session, self._servable(), self.settings.lease_seconds, self.settings.scheduler
            )

    async def _hold(self, model: str) -> VllmEngine:
        """Load (or wake) `model`, announcing every model meanwhile; learn what it cost."""
        switching = self._last_held not in (None, model)
        if self.slot.held != model:
            self.health.set(HealthState.STARTING, f"loading {model}")
        started = time.monotonic()
        loading = {ANNOUNCEMENT_KEY: self._loading_announcement().model_dump()}
        beat = LoadingBeat(
            self.settings, self.options.worker_id, model, self.settings.lease_seconds / 3, loading
        )
        with beat:
            engine = await self.slot.hold(model, self.choices[model])
            beat.ready()
        took = time.monotonic() - started
        self._last_held = model
        if switching:
            self.switches.count += 1
            self.switches.seconds += took
        if took > 1.0 or model not in self.switches.load_seconds:
            self.switches.load_seconds[model] = took
            log.info("holding %s (loaded in %.1f s)", model, took)
        self._endpoints[model] = engine.endpoints
        engine.announce_standby(self._standby(model))
        engine.configuration[SWITCHING_KEY] = self.switches.shown(model)
        return engine

    def _loading_announcement(self) -> Announcement:
        """What the row announces while a model loads: every model, endpoints as known."""
        return Announcement(names=[], endpoints=[], standby=self._standby(None))

    def _standby(self, held: str | None) -> list[StandbyModel]:
        return [
            StandbyModel(name=name, endpoints=self._endpoints.get(name))
            for name in self.choices
            if name != held
        ]

    async def _work(self, engine: VllmEngine, held: str, stop: asyncio.Event) -> int:
        leave = asyncio.Event()
        worker = Worker(self.settings, engine, self.options, health=self.health)
        watch = asyncio.create_task(self._watch(worker, held, leave))
        try:
            return await worker.run(stop, leave)
        finally:
            watch.cancel()

    async def _watch(self, worker: Worker, held: str, leave: asyncio.Event) -> None:
        since = time.monotonic()
        while True:
            await asyncio.sleep(DEMAND_POLL_SECONDS)
            try:
                queued = await asyncio.to_thread(self._queued)
            except Exception as exc:  # an outage: the worker waits it out, and so does this
                log.debug("could not read the models' queues: %s", exc)
                continue
            holding_work = held in queued or bool(worker.active)
            cost = self.switches.cost_of(queued[0]) if queued else 0.0
            held_for = time.monotonic() - since
            if self.rule.should_leave(held, queued, held_for, cost, holding_work):
                log.info("leaving %s for %s after %.0f s", held, queued[0], held_for)
                self._next = queued[0]
                leave.set()
                return
