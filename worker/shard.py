"""Running one leased shard: read → schedule → collect → checkpoint, until done or told to stop.

The checkpoint is the lease's heartbeat: on a timer (≤ 1 s) it stores the finished lines as a
chunk object and, in one fenced transaction, records the chunk, adds its counts to the shard
and renews the lease. The same transaction reads the batch's status, so a cancel or an expiry
is seen within one tick; then in-flight requests are aborted, what finished is kept, and the
shard is handed back. A lease that cannot be renewed in time (the database is away) is let
go: in-flight requests are aborted and unrecorded results dropped, so the next holder runs
exactly those lines again.

A chunk whose record failed is deleted only if no row names it (a commit whose reply was lost
recorded it all the same). A recorded chunk whose object is gone has its row dropped and its
lines run again; an input file that is gone fails the batch (`app.services.steps.lost_objects`).
"""

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import FIRST_EPOCH, BatchState, ShardLease
from app.core.states import ShardOutcome
from app.db.models import Batch
from app.db.session import session_scope
from app.services.lease import end_if_left_idle
from app.services.steps import lost_objects
from app.services.steps.chunk_cleanup import delete_unrecorded
from app.services.steps.recorded import Recorded, read_recorded
from app.storage import Storage
from app.storage.base import StorageFull
from worker import claim, reader
from worker.engine_results import EngineResult
from worker.scheduler import Job, Scheduler
from worker.writer import Chunk, ResultWriter

log = logging.getLogger("overnight.worker")

READ_BATCH = 64


class HeartbeatLost(RuntimeError):
    """The lease could not be renewed in time: someone else may hold the shard by now."""


class Renewal(Enum):
    RENEWED = "renewed"
    CLOSED = "closed"  # the shard is done, with its last lines
    LOST = "lost"  # someone else holds the lease: nothing was written
    FAILED = "failed"  # the database or the store failed; the next tick may repair it


@dataclass(frozen=True)
class Checkpoint:
    """What one checkpoint did, and the batch's state if the lease was renewed."""

    renewal: Renewal
    state: BatchState | None = None


@dataclass(frozen=True)
class RunOptions:
    checkpoint_seconds: float
    lease_seconds: float
    drain_seconds: float


class ShardRun:
    """One leased shard from claim to done, release or loss of the lease."""

    def __init__(
        self,
        settings: Settings,
        storage: Storage,
        scheduler: Scheduler,
        lease: ShardLease,
        options: RunOptions,
    ) -> None:
        self.settings = settings
        self.storage = storage
        self.scheduler = scheduler
        self.lease = lease
        self.options = options
        self.writer = ResultWriter(storage, lease)
        self.fed_all = asyncio.Event()
        self.recorded = 0
        # The run closed the batch's last open shard: the batch is ready to finalize.
        self.closed_batch = False
        self._outstanding = 0
        self._wake = asyncio.Event()
        self._pending: Chunk | None = None
        self._engine_error: BaseException | None = None
        self._stop_deadline: float | None = None
        # When the last renewal that went through began: the database stamped it later.
        self._last_heartbeat = time.monotonic()
        self._renewed = asyncio.Event()
        self._over = False
        self._failing = False

    # -- Sink: called by the scheduler as results arrive --
    def deliver(self, job: Job, result: EngineResult, copied: bool) -> None:
        self.writer.add(job, result, copied)
        self._outstanding -= 1
        if self._outstanding == 0:
            self._wake.set()

    def engine_failed(self, error: BaseException) -> None:
        self._engine_error = error
        self._wake.set()

    async def leased(self) -> bool:
        """True once the lease is surely still this run's; False once the run is over.

        The scheduler sends a request to the engine only on True: a worker that was frozen
        (or could not renew) for longer than `_lease_may_have_lapsed` allows first renews,
        and one whose shard was taken over meanwhile sends none of its lines, which the new
        holder may have persisted by now: neither those waiting here when the loss is found
        nor those the feeder handed over after it.
        """
        while self._lease_may_have_lapsed() and not self._over:
            self._renewed.clear()
            self._wake.set()
            await self._renewed.wait()
        return not self._over

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Session]:
        """A transaction under the shard's lease, ended by the database if this worker freezes
        in it: its row locks would otherwise keep every taker off the shard."""
        with session_scope(self.settings) as session:
            end_if_left_idle(session, self.options.lease_seconds)
            yield session

    def _lease_may_have_lapsed(self) -> bool:
        return time.monotonic() - self._last_heartbeat > self.options.lease_seconds * 2 / 3

    # -- control --
    def request_stop(self) -> None:
        """Stop reading; give in-flight requests `drain_seconds` to finish, then release."""
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.options.drain_seconds
            self.fed_all.set()
            self._wake.set()

    async def run(self) -> ShardOutcome:
        """Returns how it ended."""
        recorded = await asyncio.to_thread(self._resume)
        if recorded is None:
            return await self._lost()
        self.recorded = len(recorded.lines)
        feeder = asyncio.create_task(self._feed(recorded.lines))
        try:
            return await self._supervise(feeder)
        finally:
            self._over = True
            self._renewed.set()
            feeder.cancel()
            await asyncio.gather(feeder, return_exceptions=True)

    async def _feed(self, skip: set[int]) -> None:
        lines = reader.read_requests(self.storage, self.lease, skip)
        while self._stop_deadline is None:
            batch = await asyncio.to_thread(reader.take, lines, READ_BATCH)
            if not batch:
                break
            for line, custom_id, url, body in batch:
                if self._stop_deadline is not None or self._over:
                    return
                job = Job(self, self.lease.batch_id, url, line, custom_id, body)
                self._outstanding += 1
                try:
                    await self.scheduler.submit(job)
                except asyncio.CancelledError:
                    self._outstanding -= 1
                    raise
        self.fed_all.set()
        if self._outstanding == 0:
            # Else the last answer wakes the supervisor to close the shard: a checkpoint now
            # would meet the worker's next claim, which this very moment triggers.
            self._wake.set()

    async def _supervise(self, feeder: "asyncio.Task[None]") -> ShardOutcome:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.checkpoint_seconds)
            self._wake.clear()
            if self._engine_error is not None:
                await self._let_go()
                raise self._engine_error
            if feeder.done() and not feeder.cancelled() and (error := feeder.exception()):
                if isinstance(error, lost_objects.MissingInput):
                    return await self._input_missing(error)
                await self._let_go()
                raise error
            finished = self.fed_all.is_set() and self._outstanding == 0
            if self._stop_deadline is not None:
                if finished and not self._has_every_line():
                    return await self._let_go()
                if not finished and time.monotonic() >= self._stop_deadline:
                    return await self._let_go()
            try:
                checkpoint = await self._checkpoint(done=finished)
            except HeartbeatLost as lost:
                log.warning("%s: letting the shard go", lost)
                return await self._lost()
            if checkpoint.renewal is Renewal.LOST:
                return await self._lost()
            if checkpoint.renewal is Renewal.CLOSED:
                self.closed_batch = checkpoint.state is not None and checkpoint.state.last_shard
                self._check_complete()
                return ShardOutcome.DONE
            if checkpoint.state and (reason := checkpoint.state.should_stop()):
                return await self._let_go(reason)

    def _has_every_line(self) -> bool:
        pending = self._pending.lines if self._pending else 0
        return self.recorded + pending + self.writer.buffered >= self.lease.line_count

    def _check_complete(self) -> None:
        if self.recorded != self.lease.line_count:
            log.warning(
                "shard %s of %s: %d results for %d lines",
                self.lease.index,
                self.lease.batch_id,
                self.recorded,
                self.lease.line_count,
            )

    async def _lost(self) -> ShardOutcome:
        """Someone else may hold the shard: abort what runs; unrecorded results are dropped."""
        self._over = True  # what the feeder still hands over is never sent
        self.fed_all.set()
        await self.scheduler.abort(self)
        return ShardOutcome.LOST

    async def _let_go(self, reason: ShardOutcome = ShardOutcome.RELEASED) -> ShardOutcome:
        """Abort what runs, keep what finished, hand the shard back."""
        self.fed_all.set()
        aborted = await self.scheduler.abort(self)
        log.info(
            "shard %d of %s: %s, aborted %d requests",
            self.lease.index,
            self.lease.batch_id,
            reason,
            aborted,
        )
        while True:
            try:
                checkpoint = await self._checkpoint(release=True)
            except HeartbeatLost:
                return ShardOutcome.LOST
            if checkpoint.renewal is Renewal.LOST:
                return ShardOutcome.LOST
            if checkpoint.renewal is not Renewal.FAILED:
                return reason
            await asyncio.sleep(self.options.checkpoint_seconds)

    async def _input_missing(self, missing: lost_objects.MissingInput) -> ShardOutcome:
        """The batch's input file is gone: abort what runs and fail the batch, naming it."""
        self.fed_all.set()
        await self.scheduler.abort(self)
        if not await asyncio.to_thread(self._fail_batch, missing.key):
            return ShardOutcome.LOST
        return ShardOutcome.BATCH_ENDED

    def _fail_batch(self, key: str) -> bool:
        """Fails the batch, fenced by the lease (handed back); False if the lease was lost."""
        with self._transaction() as session:
            # The finalizer's lock order: the batch, then its shards.
            batch = session.scalar(
                select(Batch).where(Batch.id == self.lease.batch_id).with_for_update()
            )
            assert batch is not None
            if claim.checkpoint(session, self.lease, release=True) is None:
                return False
            lost_objects.fail_batch(session, batch, key)
        return True

    def _resume(self) -> Recorded | None:
        """What earlier holders recorded; lines of chunks whose objects are gone are
        forgotten (fenced by the lease) and run again. None if the lease was lost."""
        if self.lease.epoch == FIRST_EPOCH:
            # The shard's first holder: nobody recorded anything before it, so no transaction
            # (at the start of a batch every worker would run one beside its next claim).
            return Recorded()
        with self._transaction() as session:
            keys = claim.recorded_chunk_keys(session, self.lease.shard_id)
        recorded = read_recorded(self.storage, keys)
        if not recorded.missing:
            return recorded
        with self._transaction() as session:
            if claim.checkpoint(session, self.lease) is None:
                return None
            lost_objects.forget_chunks(session, self.lease.shard_id, recorded)
        return recorded

    async def _checkpoint(self, done: bool = False, release: bool = False) -> Checkpoint:
        """Store finished lines and renew the lease (or close or release the shard)."""
        if self._pending is None:
            self._pending = self.writer.seal()
        chunk = self._pending
        try:
            stored = await self._store(chunk)
            # Close the shard only with its last lines, never ahead of them.
            closing = done and stored and self.writer.buffered == 0
            recorded = chunk if stored else None
            started = time.monotonic()
            state = await asyncio.to_thread(
                self._record, recorded, closing, release and not closing
            )
        except Exception as exc:
            if self._lease_may_have_lapsed():
                why = str(exc).partition("\n")[0]  # a database error goes on with its SQL
                raise HeartbeatLost(
                    f"cannot renew the lease of shard {self.lease.shard_id} "
                    f"({type(exc).__name__}: {why})"
                ) from exc
            if not self._failing:
                log.warning("checkpoint of shard %s failed, retrying: %s", self.lease.shard_id, exc)
            self._failing = True
            return Checkpoint(Renewal.FAILED)
        self._failing = False
        if stored:
            self._pending = None
        if state is None:
            if recorded is not None:
                await self._discard(recorded)
            return Checkpoint(Renewal.LOST)
        self._last_heartbeat = started
        self._renewed.set()
        if recorded is not None:
            self.recorded += recorded.lines
        if closing:
            return Checkpoint(Renewal.CLOSED, state)
        if done and stored:
            self._wake.set()
        return Checkpoint(Renewal.RENEWED, state)

    async def _discard(self, chunk: Chunk) -> None:
        """Deletes a chunk whose record was refused, unless a row names it after all."""
        try:
            await asyncio.to_thread(
                delete_unrecorded, self.settings, self.storage, self.lease, chunk.sequence
            )
        except Exception as exc:
            # Kept: an object no row names is only wasted space, a deleted recorded one a
            # batch that cannot end.
            log.warning("kept chunk %s: cannot tell whether it was recorded: %s", chunk.key, exc)

    async def _store(self, chunk: Chunk | None) -> bool:
        """Writes the chunk; False while the store is full, keeping it for the next tick.

        The lease is renewed all the same, so a full store pauses the shard (its results
        wait in memory) instead of losing it; nothing persisted is ever at stake.
        """
        if chunk is None:
            return True
        try:
            await asyncio.to_thread(self.writer.write, chunk)
        except StorageFull as exc:
            log.warning(
                "shard %s of %s: %d results wait in memory: %s",
                self.lease.index,
                self.lease.batch_id,
                chunk.lines + self.writer.buffered,
                exc,
            )
            return False
        return True

    def _record(self, chunk: Chunk | None, done: bool, release: bool) -> BatchState | None:
        row = (chunk.sequence, chunk.key, chunk.lines) if chunk else None
        progress = chunk.progress if chunk else None
        try:
            with self._transaction() as session:
                return claim.checkpoint(
                    session, self.lease, chunk=row, progress=progress, done=done, release=release
                )
        except IntegrityError:
            # The previous attempt at this very chunk did commit (its reply was lost).
            if chunk is None:
                raise
            with self._transaction() as session:
                return claim.checkpoint(session, self.lease, done=done, release=release)
