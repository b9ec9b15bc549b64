"""The worker: claim shards → run them through one shared in-flight window → finalize.

The next shard is claimed as soon as every running shard has fed all its lines, so the engine
never drains at a shard boundary. An idle worker on SQLite looks every 20 ms whether the
database changed (`app.db.changes`) and claims then, so a batch starts within milliseconds
of going in_progress; the claim poll (`worker_poll_seconds`) remains for what no commit
announces (a lapsed lease) and for PostgreSQL. Two side tasks are supervised: the worker's
own heartbeat (the `workers` row) and the finalizer trigger. A database outage never stops
the worker: a shard whose lease cannot be renewed is let go (worker/shard.py), the heartbeat
probes the database with backoff while the health says `waiting_for_database`, and claiming
resumes when it answers. Only a dead engine, or a database call failing for another reason
than an outage (a bug: logged with its traceback), stops the process. SIGTERM stops
claiming, lets in-flight requests finish for a short while, checkpoints and releases every
lease.
"""

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from app.config import Settings
from app.core.leases import ShardLease
from app.core.states import FINALIZABLE_OUTCOMES, ShardOutcome
from app.db.changes import ChangeWatch, watch_for
from app.db.session import one_statement_scope, session_scope, upgrade
from app.services.media_urls import MediaRule
from app.services.steps.finalization import finalize_ready_batches
from app.storage import Storage, storage_of
from worker import claim, registry
from worker.backoff import BackoffPolicy, follow_online_traffic
from worker.engine import Engine, EngineDeadError
from worker.health import Health, HealthState
from worker.media_guard import MediaGuard
from worker.outage import backoff, database_down, first_line, until_database
from worker.scheduler import Scheduler
from worker.shard import RunOptions, ShardRun

log = logging.getLogger("overnight.worker")

SHARD_ERROR_PAUSE_SECONDS = 5.0
# How often a worker that may claim looks whether the database changed (microseconds each).
WATCH_SECONDS = 0.02
# After a claim that found nothing, the next one a change triggers waits this long, doubling
# up to the maximum: an idle worker beside a busy one would otherwise run a claim transaction
# on every checkpoint of the other (each one CPU taken from the busy engine's cores).
EMPTY_CLAIM_PAUSE_SECONDS = (WATCH_SECONDS, 1.0)


@dataclass(frozen=True)
class WorkerOptions:
    worker_id: str
    window: int | None = None
    dedup: bool = True
    prefix_grouping: bool = True
    max_active_shards: int = 3
    # With the online API on: how the batch window gives way to online requests.
    backoff: BackoffPolicy | None = None


class Worker:
    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        options: WorkerOptions,
        storage: Storage | None = None,
        health: Health | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.options = options
        self.health = health or Health(options.worker_id)
        self.storage = storage or storage_of(settings)
        window = options.window or 2 * engine.max_num_seqs
        self.scheduler = Scheduler(
            MediaGuard(engine, MediaRule.of(settings)),
            window,
            dedup=options.dedup,
            prefix_grouping=options.prefix_grouping,
            # vLLM's engine with LoRA on: which lines' adapters may share it (worker.adapters).
            adapters=getattr(engine, "adapter_rule", None),
        )
        self.run_options = RunOptions(
            checkpoint_seconds=settings.worker_checkpoint_seconds,
            lease_seconds=settings.lease_seconds,
            drain_seconds=settings.worker_drain_seconds,
        )
        self.active: dict[asyncio.Task[ShardOutcome], ShardRun] = {}
        self._changed = asyncio.Event()
        self._watchers: set[asyncio.Task[None]] = set()
        self._finalize_wanted = asyncio.Event()
        self._fatal: BaseException | None = None
        self._claim_after = 0.0
        self._watch = watch_for(settings.sqlalchemy_url)
        self._seen_version: int | None = None
        self._next_poll = 0.0
        self._empty_claims = 0
        self._quiet_until = 0.0  # no change-triggered claim before this (monotonic)
        self._leave: asyncio.Event | None = None
        self._stop = asyncio.Event()

    async def run(self, stop: asyncio.Event, leave: asyncio.Event | None = None) -> int:
        """Work until `stop` is set (0) or something fatal happens (1).

        `leave` (a switching worker, `worker.switching`): once set, claim nothing more, finish
        the shards held, and return 0 with the worker's row and health left as they are.
        """
        self._leave, self._stop = leave, stop
        model = self.engine.served_names[0]
        registering = (registry.register, model, self.engine.configuration)
        if not await until_database(self.health, stop, self._db, *registering):
            self.health.set(HealthState.STOPPED)
            return 0
        self.health.set(HealthState.READY)
        side = [
            asyncio.create_task(self._heartbeat(), name="heartbeat"),
            asyncio.create_task(self._finalizer(), name="finalizer"),
        ]
        traffic = getattr(self.engine, "traffic", None)
        if traffic is not None and self.options.backoff is not None:
            online = follow_online_traffic(traffic, self.scheduler, self.options.backoff)
            side.append(asyncio.create_task(online, name="online backoff"))
        stopper = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set() and self._fatal is None and not self._left():
                if broken := next((t for t in side if t.done()), None):
                    self._fatal = broken.exception() or RuntimeError(f"{broken.get_name()} ended")
                    break
                ready = self._may_claim()
                if ready and self._claim_due() and await self._claim():
                    continue
                self._changed.clear()
                waiters: list[asyncio.Task[Any]] = [asyncio.create_task(self._changed.wait())]
                if leave is not None:
                    waiters.append(asyncio.create_task(leave.wait()))
                if ready and self._watch is not None:
                    waiters.append(asyncio.create_task(self._database_changed(self._watch)))
                await asyncio.wait(
                    [stopper, *waiters, *side],
                    timeout=self._poll_seconds(),
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for waiter in waiters:
                    waiter.cancel()
        finally:
            if self._watch is not None:
                self._watch.close()
            stopper.cancel()
            self.health.set(HealthState.DRAINING)
            await self._stop_runs()
            await self._finalize_now()
            for task in side:
                task.cancel()
            await asyncio.gather(*side, return_exceptions=True)
            if not self._left():
                await self._record_stop()
        if self._left():
            return 0
        self.health.set(HealthState.STOPPED, str(self._fatal or ""))
        if self._fatal is not None:
            log.error("worker stopped: %s", self._fatal)
            return 1
        return 0

    @property
    def failure(self) -> BaseException | None:
        """What stopped the worker, when `run` returned 1 (a dead engine, a bug)."""
        return self._fatal

    def _leaving(self) -> bool:
        return self._leave is not None and self._leave.is_set()

    def _left(self) -> bool:
        """Told to leave (and not to stop), and every held shard has ended."""
        leaving = self._leaving() and not self._stop.is_set()
        return leaving and not self.active and self._fatal is None

    async def _record_stop(self) -> None:
        try:
            await asyncio.to_thread(self._db, registry.stopped)
        except Exception as exc:
            log.warning("could not record the worker's stop: %s", exc)

    def _db(self, action: Callable[..., object], *args: object) -> object:
        with session_scope(self.settings) as session:
            return action(session, self.options.worker_id, *args)

    def _may_claim(self) -> bool:
        if self.scheduler.failure is not None:
            self._fatal = self.scheduler.failure
            return False
        if self.health.state is not HealthState.READY or time.monotonic() < self._claim_after:
            return False
        if self._leaving():
            return False
        runs = self.active.values()
        return len(runs) < self.options.max_active_shards and all(r.fed_all.is_set() for r in runs)

    def _poll_seconds(self) -> float:
        """How often to claim regardless: with a watch, only a lapsed lease goes unannounced,
        and a lease takes `lease_seconds` to lapse."""
        poll = self.settings.worker_poll_seconds
        return poll if self._watch is None else max(poll, self.settings.lease_seconds / 10)

    def _claim_due(self) -> bool:
        """Whether a claim is worth its transaction: the database changed, or the poll is due.

        The version is read before the claim, so a commit during it shows as a change next time.
        """
        now = time.monotonic()
        if now < min(self._quiet_until, self._next_poll):
            return False
        version = self._watch.version() if self._watch is not None else None
        if version is not None and version == self._seen_version and now < self._next_poll:
            return False
        self._seen_version = version
        self._next_poll = now + self._poll_seconds()
        return True

    async def _database_changed(self, watch: ChangeWatch) -> None:
        await asyncio.sleep(max(self._quiet_until - time.monotonic(), 0.0))
        version = watch.version()
        while version is not None and version == self._seen_version:
            await asyncio.sleep(WATCH_SECONDS)
            version = watch.version()

    def _take_shard(self, loaded: frozenset[str] | None = None) -> ShardLease | None:
        """The claim's transaction (blocking: it runs in a thread); `loaded`: the LoRA
        adapters the engine holds, None without LoRA."""
        with one_statement_scope(self.settings) as session:
            return claim.claim_shard(
                session,
                self.options.worker_id,
                self.engine.served_names,
                self.settings.lease_seconds,
                self.settings.scheduler,
                loaded,
            )

    def _loaded_adapters(self) -> frozenset[str] | None:
        # Read on the event loop, which loads and unloads them, not in the claim's thread.
        loaded = getattr(self.engine, "loaded_adapters", None)
        return None if loaded is None else cast(frozenset[str] | None, loaded())

    async def _claim(self) -> bool:
        try:
            lease = await asyncio.to_thread(self._take_shard, self._loaded_adapters())
        except Exception as exc:
            self._database_failed(exc, "claiming a shard")
            return False
        self._paced(found=lease is not None)
        if lease is None:
            return False
        log.info("claimed shard %d of %s (epoch %d)", lease.index, lease.batch_id, lease.epoch)
        run = ShardRun(self.settings, self.storage, self.scheduler, lease, self.run_options)
        task = asyncio.create_task(run.run())
        self.active[task] = run
        task.add_done_callback(self._run_ended)
        self._watchers.add(watcher := asyncio.create_task(self._wake_when_fed(run)))
        watcher.add_done_callback(self._watchers.discard)
        return True

    def _paced(self, found: bool) -> None:
        """Back off change-triggered claims while they keep finding nothing."""
        self._empty_claims = 0 if found else self._empty_claims + 1
        first, most = EMPTY_CLAIM_PAUSE_SECONDS
        pause = 0.0 if found else min(first * 2 ** (self._empty_claims - 1), most)
        self._quiet_until = time.monotonic() + pause

    async def _wake_when_fed(self, run: ShardRun) -> None:
        # The next shard is claimed as soon as this one has no more lines to read.
        await run.fed_all.wait()
        self._changed.set()

    def _run_ended(self, task: "asyncio.Task[ShardOutcome]") -> None:
        run = self.active.pop(task)
        lease = run.lease
        error = None if task.cancelled() else task.exception()
        if task.cancelled():
            outcome = ShardOutcome.ABORTED
        elif error is not None:
            outcome = ShardOutcome.FAILED
            if isinstance(error, EngineDeadError) or self.scheduler.failure:
                self._fatal = error
            else:
                # The shard went back to pending: do not take it again in a tight loop.
                self._claim_after = time.monotonic() + SHARD_ERROR_PAUSE_SECONDS
        else:
            outcome = task.result()
        log.info("shard %d of %s: %s %r", lease.index, lease.batch_id, outcome, error or "")
        # A shard that closes while others of its batch are open leaves nothing to finalize: a
        # pass over every batch per shard would cost more than the shard's own checkpoints.
        if outcome in FINALIZABLE_OUTCOMES and (outcome != ShardOutcome.DONE or run.closed_batch):
            self._finalize_wanted.set()
        self._changed.set()

    async def _stop_runs(self) -> None:
        for run in self.active.values():
            run.request_stop()
        if self.active:
            await asyncio.gather(*self.active, return_exceptions=True)

    async def _heartbeat(self) -> None:
        """Renew the `workers` row; while the database is away, probe it with backoff."""
        interval = min(self.settings.lease_seconds / 3, 5.0)
        last_tokens, last_time = 0, time.monotonic()
        retries = backoff(cap=interval)
        # `--lora-dir`'s folders are rescanned at each beat; a changed announcement is written
        # with the beat (kept until a beat succeeds).
        rescan = getattr(self.engine, "rescan_adapters", None)
        announce = False
        while True:
            waiting = self.health.state is HealthState.WAITING_FOR_DATABASE
            await asyncio.sleep(next(retries) if waiting else interval)
            announce = (rescan is not None and await rescan()) or announce
            now = time.monotonic()
            tokens = self.scheduler.output_tokens
            rate = (tokens - last_tokens) / max(now - last_time, 1e-6)
            last_tokens, last_time = tokens, now
            current = next(iter(self.active.values()), None)
            try:
                await asyncio.to_thread(
                    self._db,
                    registry.heartbeat,
                    current.lease.shard_id if current else None,
                    rate,
                    self.engine.stats(),
                    self.engine.configuration if announce else None,
                )
            except Exception as exc:
                self._database_failed(exc, "the worker's heartbeat")
                continue
            announce = False
            retries = backoff(cap=interval)
            if self.health.state is HealthState.WAITING_FOR_DATABASE:
                self.health.set(HealthState.READY, "the database answers again")
                self._changed.set()

    def _database_failed(self, error: Exception, during: str) -> None:
        """An outage is waited out: the heartbeat probes the database until it answers, then
        claiming resumes. Anything else is a bug that waiting never ends: the worker stops
        (exit 1, so that its supervisor restarts it), its traceback logged."""
        if not database_down(error):
            log.error("%s failed: stopping the worker", during, exc_info=error)
            self._fatal = self._fatal or error
            self._changed.set()
        elif self.health.state is HealthState.READY:
            self.health.set(HealthState.WAITING_FOR_DATABASE, first_line(error))

    async def _finalizer(self) -> None:
        while True:
            await self._finalize_wanted.wait()
            self._finalize_wanted.clear()
            await self._finalize_now()

    async def _finalize_now(self) -> None:
        try:
            await asyncio.to_thread(
                finalize_ready_batches, self.settings, self.options.worker_id, self.storage
            )
        except Exception:
            # The API's housekeeping loop finalizes too: a failure here delays, loses nothing.
            log.exception("finalizing failed")


async def work(
    settings: Settings,
    engine: Engine,
    options: WorkerOptions,
    health: Health,
    stop: asyncio.Event,
) -> int:
    """A worker process once its engine runs: wait for the database and its schema, then work."""
    if not await until_database(health, stop, upgrade, settings.sqlalchemy_url):
        health.set(HealthState.STOPPED)
        return 0
    return await Worker(settings, engine, options, health=health).run(stop)


def install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
