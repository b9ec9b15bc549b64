"""What a lease holder holds: a batch (validation, finalization) or a shard (a worker).

Taking a lease bumps its epoch; every later write names that epoch and is refused once
someone else holds a newer one (fencing).
"""

from dataclasses import dataclass

from app.core.chunks import chunk_key
from app.core.states import BatchStatus, ShardOutcome

# The epoch of a lease's first holder: a shard's epoch starts at 0 and every claim bumps it.
FIRST_EPOCH = 1


@dataclass(frozen=True)
class BatchLease:
    batch_id: str
    owner: str
    epoch: int


@dataclass(frozen=True)
class ShardLease:
    """A shard a worker holds, with what it needs to run it."""

    shard_id: int
    batch_id: str
    index: int
    first_line: int
    line_count: int
    byte_start: int
    byte_end: int
    epoch: int
    owner: str
    endpoint: str
    input_key: str

    def chunk_key(self, sequence: int) -> str:
        return chunk_key(self.batch_id, self.index, self.epoch, sequence)


@dataclass(frozen=True)
class BatchState:
    """The batch as a shard holder sees it at each checkpoint."""

    status: BatchStatus
    expires_at: int
    # The database's time at the checkpoint: expiry is judged by its clock, not the holder's.
    checked_at: float
    # Set by the checkpoint that closes a shard: no other shard of the batch is open, so the
    # batch is ready to finalize.
    last_shard: bool = False

    def should_stop(self) -> ShardOutcome | None:
        """Why a holder must let go of the batch's shards now, if it must."""
        if self.status == BatchStatus.CANCELLING:
            return ShardOutcome.CANCELLED
        if self.status != BatchStatus.IN_PROGRESS:
            return ShardOutcome.BATCH_ENDED
        if self.checked_at >= self.expires_at:
            return ShardOutcome.EXPIRED
        return None
