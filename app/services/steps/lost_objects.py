"""Objects a row names but the store no longer has: each is an explicit outcome, never a
retry for ever.

- A result chunk: its row is dropped and the shard's counts become those of the chunks that
  remain, so its lines run again (or, in a batch ending cancelled or expired, get that
  ending's error line). A worker does it when it resumes the shard, the finalizer when it
  merges one (and sends a done shard back to run).
- The input file: the batch fails with an `input_file_missing` error naming the object.

Callers fence each of these writes with their lease (the shard's, or the batch's), in the
same transaction.
"""

import logging
import time
from collections.abc import Iterator

from sqlalchemy import delete, update
from sqlalchemy.orm import Session

from app.core.states import TERMINAL_BATCH_STATUSES, BatchStatus, ShardStatus
from app.db.models import Batch, ResultChunk, Shard
from app.schemas.batches import BatchError
from app.services.jsonl import iter_lines
from app.services.steps.batch_end import end_batch
from app.services.steps.recorded import Recorded
from app.storage import Storage

log = logging.getLogger("overnight.worker")

INPUT_FILE_MISSING = "input_file_missing"


class MissingInput(Exception):
    """The batch's input file is gone from the store."""

    def __init__(self, key: str) -> None:
        super().__init__(f"input object {key!r} is gone from the store")
        self.key = key


def input_lines(
    storage: Storage, key: str, start: int, end: int, first_line: int
) -> Iterator[tuple[int, bytes]]:
    """`iter_lines` of a batch's input file, raising `MissingInput` if the store lost it."""
    try:
        yield from iter_lines(storage, key, start, end, first_line)
    except FileNotFoundError as exc:
        raise MissingInput(key) from exc


def forget_chunks(session: Session, shard_id: int, recorded: Recorded) -> None:
    """Drops the rows of the shard's chunks whose objects are gone; it counts what remains."""
    session.execute(
        delete(ResultChunk).where(
            ResultChunk.shard_id == shard_id, ResultChunk.storage_key.in_(recorded.missing)
        )
    )
    session.execute(
        update(Shard)
        .where(Shard.id == shard_id)
        .values(recorded.progress.values())
        .execution_options(synchronize_session=False)
    )
    log.warning(
        "shard %d: result chunks gone from the store, their lines run again: %s",
        shard_id,
        ", ".join(recorded.missing),
    )


def reopen(session: Session, batch: Batch, shard_id: int) -> None:
    """Sends a done shard back to run its lost lines, and its batch back to running (or to
    `cancelling` if a cancel came: those lines then end `batch_cancelled`)."""
    session.execute(
        update(Shard)
        .where(Shard.id == shard_id)
        .values(status=ShardStatus.PENDING, lease_owner=None)
        .execution_options(synchronize_session=False)
    )
    if batch.status == BatchStatus.FINALIZING:
        batch.status = BatchStatus.CANCELLING if batch.cancelling_at else BatchStatus.IN_PROGRESS
        batch.finalizing_at = None


def fail_batch(session: Session, batch: Batch, key: str) -> bool:
    """Fails the batch, whose input file is gone: no request of it can be read any more.
    False if it had ended already."""
    if batch.status in TERMINAL_BATCH_STATUSES:
        return False
    message = (
        f"The input file {batch.input_file_id} is gone from storage (object {key}): "
        "the batch's requests can no longer be read."
    )
    error = BatchError(code=INPUT_FILE_MISSING, message=message, param="input_file_id")
    batch.errors = [error.model_dump()]
    end_batch(session, batch, BatchStatus.FAILED, int(time.time()))
    log.error("batch %s failed: %s", batch.id, message)
    return True
