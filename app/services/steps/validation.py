"""Asynchronous validation of a batch's input file: `validating` → `in_progress` or `failed`.

The file is streamed once. Every problem is recorded with its 1-based line (up to
`settings.max_reported_errors`; the checks are `steps.line_checks`); a clean file is cut into
shards with their byte ranges. Validation runs under the batch lease and ends in one fenced
transaction, so a validator killed at any point is simply replaced by the next
one after `lease_seconds`, and the shards are written exactly once.
"""

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.config import Settings
from app.core.leases import BatchLease
from app.core.sizes import too_large_message
from app.core.states import BatchStatus, BatchStep
from app.db.clock import db_now
from app.db.models import Batch, File, Shard, ShardAdapter
from app.db.session import session_scope
from app.schemas.batches import BatchError
from app.services import enqueued, schedule
from app.services.jsonl import scan_lines
from app.services.steps import batch_lease, step_share
from app.services.steps.batch_end import end_batch
from app.services.steps.batch_lease import Heartbeat
from app.services.steps.line_checks import LineChecker, batch_error
from app.storage import Storage, storage_of

log = logging.getLogger("overnight.validation")

# A file whose validation keeps killing its validator fails instead of looping forever.
MAX_VALIDATION_ATTEMPTS = 5
_HEARTBEAT_CHECK_LINES = 256


@dataclass
class ShardPlan:
    index: int
    first_line: int
    byte_start: int
    line_count: int = 0
    prompt_tokens: int = 0
    # The models its lines name: the batch's base model and its LoRA adapters.
    models: set[str] = field(default_factory=set)


@dataclass
class Outcome:
    """What reading the file found: problems, or shards ready to run."""

    errors: list[BatchError] = field(default_factory=list)
    shards: list[ShardPlan] = field(default_factory=list)
    total: int = 0
    model: str | None = None
    size: int = 0


def read_input(
    settings: Settings,
    storage: Storage,
    key: str,
    endpoint: str,
    heartbeat: Heartbeat | None = None,
    per_line: bool = False,
) -> Outcome | None:
    """Streams the file once; None if the heartbeat says to stop (lease lost, batch cancelled)."""
    outcome = Outcome(size=storage.size(key))
    checker = LineChecker(settings, endpoint, per_line)
    limit, shard_lines = settings.max_batch_requests, settings.shard_lines
    for line_no, offset, raw in _lines(storage, key):
        if outcome.total % _HEARTBEAT_CHECK_LINES == 0 and heartbeat and not heartbeat.beat():
            return None
        if outcome.total == limit:
            outcome.errors.append(_too_many(limit, line_no))
            break
        if outcome.total % shard_lines == 0:
            outcome.shards.append(ShardPlan(len(outcome.shards), line_no, offset))
        shard = outcome.shards[-1]
        shard.line_count += 1
        outcome.total += 1
        tokens_before = checker.prompt_tokens
        problem = checker.check(line_no, raw)
        shard.prompt_tokens += checker.prompt_tokens - tokens_before
        if checker.line_model is not None:
            shard.models.add(checker.line_model)
        if problem is not None:
            outcome.errors.append(problem)
            if len(outcome.errors) >= settings.max_reported_errors:
                break
    outcome.model = checker.model
    if outcome.total == 0 and not outcome.errors:
        outcome.errors.append(
            batch_error("empty_file", "The batch input file contains no requests.")
        )
    return outcome


def _lines(storage: Storage, key: str) -> Iterator[tuple[int, int, bytes]]:
    return scan_lines(storage.read(key))


def _too_many(limit: int, line_no: int) -> BatchError:
    return batch_error(
        "too_many_tasks",
        f"The batch input file has more than {limit:,} requests, the most one batch may hold.",
        line_no,
    )


@dataclass(frozen=True)
class InputFile:
    storage_key: str
    bytes: int
    endpoint: str


def claim_next(settings: Settings, owner: str) -> tuple[BatchLease, InputFile | None] | None:
    """Takes the lease of the next `validating` batch nobody is validating: the oldest of the
    project with the lowest validation clock (`step_share`), and moves that clock.

    Not one past its `expires_at`: the finalizer expires it as it is, with no request counted
    and no file (validating it now would only turn each line into a `batch_expired` one).
    """
    with session_scope(settings) as session:
        waiting = Batch.status == BatchStatus.VALIDATING
        candidates = select(Batch.id, Batch.lease_epoch).where(
            waiting, Batch.expires_at > db_now(), batch_lease.lease_is_free(settings)
        )
        rows = session.execute(
            step_share.in_order(candidates, BatchStep.VALIDATION, settings.scheduler)
            .limit(8)
            .with_for_update(skip_locked=True, of=Batch)
        ).all()
        for batch_id, epoch in rows:
            lease = batch_lease.take(session, batch_id, epoch, owner)
            if lease is not None:
                step = BatchStep.VALIDATION
                step_share.charge(session, step, batch_id, waiting, settings.scheduler)
                return lease, _input_file(session, batch_id)
    return None


def _input_file(session: Any, batch_id: str) -> InputFile | None:
    # A deleted input file keeps its bytes while a batch still reads it; only they matter.
    row = session.execute(
        select(File.storage_key, File.bytes, Batch.endpoint)
        .join(Batch, Batch.input_file_id == File.id)
        .where(Batch.id == batch_id)
    ).one()
    return InputFile(row.storage_key, row.bytes, row.endpoint) if row.storage_key else None


def validate(
    settings: Settings,
    storage: Storage,
    lease: BatchLease,
    source: InputFile | None,
    per_line: bool = False,
) -> BatchStatus | None:
    """Validates one claimed batch and records the result: its new status, None if abandoned."""
    if lease.epoch > MAX_VALIDATION_ATTEMPTS:
        message = (
            f"Validation of the input file was interrupted {MAX_VALIDATION_ATTEMPTS} times; "
            "the batch was given up."
        )
        return record(
            settings, lease, Outcome(errors=[batch_error("validation_interrupted", message)])
        )
    if source is None or not storage.exists(source.storage_key):
        message = "The input file was deleted before the batch could be validated."
        return record(
            settings,
            lease,
            Outcome(errors=[batch_error("file_not_found", message, None, "input_file_id")]),
        )
    if source.bytes > settings.max_batch_file_bytes:
        return record(settings, lease, Outcome(errors=[_too_large(settings, source.bytes)]))
    outcome = read_input(
        settings,
        storage,
        source.storage_key,
        source.endpoint,
        Heartbeat(settings, lease, BatchStatus.VALIDATING),
        per_line,
    )
    if outcome is None:
        batch_lease.release(settings, lease)
        return None
    return record(settings, lease, outcome)


def _too_large(settings: Settings, size: int) -> BatchError:
    limit = settings.size_limit("max_batch_file_bytes")
    return batch_error(
        "file_too_large",
        too_large_message("The batch input file", limit, size),
        None,
        "input_file_id",
    )


def record(settings: Settings, lease: BatchLease, outcome: Outcome) -> BatchStatus | None:
    """The one fenced transaction that ends validation: shards + `in_progress`, or `failed`."""
    with session_scope(settings) as session:
        batch = session.scalar(
            select(Batch)
            .where(
                Batch.id == lease.batch_id,
                Batch.lease_epoch == lease.epoch,
                Batch.status == BatchStatus.VALIDATING,
            )
            .with_for_update()
        )
        status = None
        if batch is not None:
            _apply(session, settings, batch, outcome)
            status = batch.status
        # Released even when fenced off: a cancel arriving mid-read is finished by the finalizer.
    if status is None:
        batch_lease.release(settings, lease)
    return status


def _apply(session: Session, settings: Settings, batch: Batch, outcome: Outcome) -> None:
    now = int(time.time())
    if not outcome.errors and outcome.model is not None:
        tokens = sum(plan.prompt_tokens for plan in outcome.shards)
        problem = enqueued.admit(session, settings, batch, outcome.model, outcome.total, tokens)
        if problem is not None:
            outcome.errors.append(problem)
    if outcome.errors:
        batch.errors = [e.model_dump() for e in outcome.errors]
        end_batch(session, batch, BatchStatus.FAILED, now)
        return
    batch.lease_owner = None
    batch.heartbeat_at = None
    batch.status = BatchStatus.IN_PROGRESS
    batch.in_progress_at = now
    batch.total = outcome.total
    batch.model = outcome.model
    schedule.admit(session, batch)
    _add_shards(session, batch, outcome)


def _add_shards(session: Session, batch: Batch, outcome: Outcome) -> None:
    """The batch's shards, each with the LoRA adapters its lines name (the models other than
    the batch's base model)."""
    ends = [s.byte_start for s in outcome.shards[1:]] + [outcome.size]
    shards = [
        Shard(
            batch_id=batch.id,
            index=plan.index,
            first_line=plan.first_line,
            line_count=plan.line_count,
            byte_start=plan.byte_start,
            byte_end=end,
            prompt_tokens=plan.prompt_tokens,
        )
        for plan, end in zip(outcome.shards, ends, strict=True)
    ]
    session.add_all(shards)
    plans = zip(shards, outcome.shards, strict=True)
    adapters = [(shard, plan.models - {outcome.model}) for shard, plan in plans]
    if not any(names for _, names in adapters):
        return
    session.flush()  # the shards' ids
    session.add_all(
        ShardAdapter(shard_id=shard.id, name=name)
        for shard, names in adapters
        for name in sorted(names)
    )


def validate_pending(
    settings: Settings, owner: str, storage: Storage | None = None, per_line: bool = False
) -> int:
    """Validates every claimable `validating` batch; returns how many were finished.

    `per_line`: `LineChecker`'s vLLM contract (`overnight run-batch`).
    """
    storage = storage or storage_of(settings)
    done = 0
    while (claimed := claim_next(settings, owner)) is not None:
        lease, source = claimed
        try:
            status = validate(settings, storage, lease, source, per_line)
        except Exception:
            log.exception("validation of %s failed; another attempt follows", lease.batch_id)
            batch_lease.release(settings, lease)
            return done
        log.info("batch %s validated: %s", lease.batch_id, status or "abandoned")
        done += 1
    return done
