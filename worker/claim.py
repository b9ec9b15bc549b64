"""Shard leases: claim, checkpoint (results + counts + heartbeat, fenced), release.

Order (`OVERNIGHT_SCHEDULER`, `app.core.schedule`): `fair` takes batches the planner found at
risk of missing `expires_at` first, earliest deadline first; then the project whose clock
(work served / weight, on this model) is lowest; then that project's batch with the least
work served; then the oldest batch, its first shard. `fifo` is the oldest batch first.

A worker with LoRA takes, within the batch that comes first, the shards whose adapters it has
loaded first (`shard_adapters`, recorded at validation): a shard that needs no adapter load
before one that does, whatever their indexes. It never reorders batches: fair share and
deadlines stay first.

A claim is one conditional `UPDATE … WHERE id = (SELECT … LIMIT 1) RETURNING`; on PostgreSQL
the inner select takes `FOR UPDATE SKIP LOCKED` so concurrent workers never wait on each
other, on SQLite every transaction is already `BEGIN IMMEDIATE`. A claim bumps the shard's
`lease_epoch`; every later write names that epoch and is refused once someone else holds a
newer one (fencing). Lapses and expiry are judged by the database's clock
(`app.services.lease`), never the worker's.
"""

from collections.abc import Collection, Sequence
from functools import cache
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    case,
    exists,
    func,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.dml import ReturningUpdate

from app.core.leases import BatchState, ShardLease
from app.core.progress import PROGRESS_FIELDS, Progress
from app.core.schedule import Order, work_of
from app.core.states import BatchStatus, ShardStatus
from app.db.clock import db_now
from app.db.models import (
    Batch,
    BatchSchedule,
    File,
    ProjectShare,
    ResultChunk,
    Shard,
    ShardAdapter,
)
from app.services import lease as leases
from app.services.schedule import record_work

# The best batches a claim looks at: enough that claims racing for the same shards skip
# to another one instead of coming back empty.
TOP_BATCHES = 4


def _claimable() -> ColumnElement[bool]:
    """A shard anyone may take: pending, or running under a lease that lapsed."""
    return or_(
        Shard.status == ShardStatus.PENDING,
        and_(
            Shard.status == ShardStatus.RUNNING,
            leases.lapsed(Shard.heartbeat_at, bindparam("lease_seconds")),
        ),
    )


def _batch_order(order: Order) -> list[Any]:
    if order is Order.FIFO:
        return [Batch.seq]
    return [
        BatchSchedule.urgent_deadline.asc().nulls_last(),
        func.coalesce(ProjectShare.vtime, 0.0),
        BatchSchedule.vtime,
        Batch.seq,
    ]


def _ranked_batches(order: Order) -> Select[Any]:
    """Batches of `models` with a claimable shard, best first, as a claim ranks them."""
    ranked = select(
        Batch.id,
        Batch.model,
        func.row_number().over(order_by=_batch_order(order)).label("rank"),
    )
    if order is Order.FAIR:  # the clocks: the batch's schedule row and its project's share
        share = (ProjectShare.project_id == Batch.project_id) & (ProjectShare.model == Batch.model)
        ranked = ranked.join(BatchSchedule, BatchSchedule.batch_id == Batch.id).outerjoin(
            ProjectShare, share
        )
    return ranked.where(
        Batch.status == BatchStatus.IN_PROGRESS,
        Batch.model.in_(bindparam("models", expanding=True)),
        Batch.expires_at > db_now(),
        exists().where(Shard.batch_id == Batch.id, _claimable()),
    ).order_by(*_batch_order(order))


def _needs_load() -> ColumnElement[bool]:
    """The shard names an adapter the worker has not loaded (`loaded`: those it has).

    A scalar subquery, not `EXISTS`: PostgreSQL turns an `EXISTS` outside the WHERE clause
    into a hashed scan of every `shard_adapters` row; this stays one primary-key probe per
    shard of the top batches.
    """
    unloaded = (
        select(literal(1))
        .where(
            ShardAdapter.shard_id == Shard.id,
            ShardAdapter.name.not_in(bindparam("loaded", expanding=True)),
        )
        .limit(1)
        .scalar_subquery()
    )
    return unloaded.is_not(None)


def _candidates(order: Order, lora: bool) -> Select[Any]:
    """Runnable shards, best first: the best batches' shards in index order (with `lora`,
    each batch's shards whose adapters are all `loaded` before its others).

    Batches are ranked first (only those with a claimable shard, `TOP_BATCHES` of them),
    then only their shards are read, through `ix_shards_claim_order`: a claim never sorts
    every open shard of the deployment.
    """
    top = _ranked_batches(order).limit(TOP_BATCHES).subquery("top")
    loads_last = [case((_needs_load(), 1), else_=0)] if lora else []
    return (
        select(Shard.id)
        .join(top, top.c.id == Shard.batch_id)
        .where(_claimable())
        .order_by(top.c.rank, *loads_last, Shard.index)
    )


def models_with_work(
    session: Session, models: Sequence[str], lease_seconds: float, order: Order = Order.FAIR
) -> list[str]:
    """The models among `models` with a claimable shard, in the order a claim over all of them
    would serve them (its best batch first): what a switching worker holds next."""
    ranked = _ranked_batches(order).subquery("ranked")
    best = func.min(ranked.c.rank)
    query = select(ranked.c.model).group_by(ranked.c.model).order_by(best)
    params = {"models": list(models), "lease_seconds": lease_seconds}
    return list(session.scalars(query, params))


@cache
def claim_statement(order: Order, lora: bool = False) -> ReturningUpdate[*tuple[Any, ...]]:
    """The claim: one conditional `UPDATE … RETURNING` of the best runnable shard, returning
    all its lease needs (one round trip: under load every round trip waits for a core).

    Built once per order, and LoRA or not (building it took most of a claim's CPU; a worker
    without LoRA runs the statement without the adapters' ordering); `claim_params` fill it.
    """
    candidate = (
        _candidates(order, lora)
        .limit(1)
        .with_for_update(skip_locked=True, of=Shard)
        .scalar_subquery()
    )
    # Spelled out: SQLAlchemy names the updated table's columns unqualified in SQLite's
    # RETURNING, subqueries included, where they would read as the subquery's own.
    shard_batch: ColumnElement[str] = literal_column("shards.batch_id")
    batch, file = aliased(Batch), aliased(File)
    endpoint = select(batch.endpoint).where(batch.id == shard_batch).scalar_subquery()
    input_file = select(batch.input_file_id).where(batch.id == shard_batch).scalar_subquery()
    input_key = select(file.storage_key).where(file.id == input_file).scalar_subquery()
    return (
        update(Shard)
        .where(Shard.id == candidate)
        .values(
            status=ShardStatus.RUNNING,
            lease_owner=bindparam("owner"),
            last_owner=bindparam("owner"),
            lease_epoch=Shard.lease_epoch + 1,
            heartbeat_at=leases.stamp(),
            attempts=Shard.attempts + 1,
        )
        .returning(  # named as ShardLease's fields
            Shard.id.label("shard_id"),
            Shard.batch_id,
            Shard.index,
            Shard.first_line,
            Shard.line_count,
            Shard.byte_start,
            Shard.byte_end,
            Shard.lease_epoch.label("epoch"),
            endpoint.label("endpoint"),
            input_key.label("input_key"),
        )
        .execution_options(synchronize_session=False)
    )


def claim_params(
    owner: str,
    models: Sequence[str],
    lease_seconds: float,
    loaded: Collection[str] | None = None,
) -> dict[str, Any]:
    """The claim statement's parameters for `owner`, serving `models` (with LoRA: and the
    adapters `loaded`)."""
    params = {"owner": owner, "models": list(models), "lease_seconds": lease_seconds}
    return params if loaded is None else {**params, "loaded": sorted(loaded)}


def claim_shard(
    session: Session,
    owner: str,
    models: Sequence[str],
    lease_seconds: float,
    order: Order = Order.FAIR,
    loaded: Collection[str] | None = None,
) -> ShardLease | None:
    """Take the best runnable shard in `order`; `loaded`: the LoRA adapters the worker has
    loaded (None without LoRA)."""
    params = claim_params(owner, models, lease_seconds, loaded)
    statement = claim_statement(order, lora=loaded is not None)
    row = session.execute(statement, params).one_or_none()
    return None if row is None else ShardLease(owner=owner, **row._mapping)


def recorded_chunk_keys(session: Session, shard_id: int) -> list[str]:
    """The shard's result chunks, in the order their results count (first wins)."""
    return list(
        session.scalars(
            select(ResultChunk.storage_key)
            .where(ResultChunk.shard_id == shard_id)
            .order_by(ResultChunk.epoch, ResultChunk.sequence)
        )
    )


def checkpoint(
    session: Session,
    lease: ShardLease,
    *,
    chunk: tuple[int, str, int] | None = None,
    progress: Progress | None = None,
    done: bool = False,
    release: bool = False,
) -> BatchState | None:
    """Record a chunk `(sequence, key, lines)` with its counts and renew the lease, atomically.

    `done` closes the shard, `release` hands it back as pending. Returns the batch's state,
    or None when the lease was lost (nothing was written then).

    Closing a shard locks the batch row first (the finalizer's order: batch, then shards), so
    of two holders closing a batch's last two shards at once, the second sees the first's
    and exactly one learns that its shard was the last. No checkpoint writes the batch row:
    its work goes to the batch's schedule row, then its project's share (`record_work`).
    """
    if done:
        session.execute(select(Batch.id).where(Batch.id == lease.batch_id).with_for_update())
    added = (progress or Progress()).values()
    status = ShardStatus.DONE if done else ShardStatus.PENDING if release else ShardStatus.RUNNING
    now = session.execute(
        update(Shard)
        .where(
            Shard.id == lease.shard_id,
            leases.held(Shard.lease_owner, lease.owner, Shard.lease_epoch, lease.epoch),
            Shard.status == ShardStatus.RUNNING,
        )
        .values({name: getattr(Shard, name) + added[name] for name in PROGRESS_FIELDS})
        .values(
            heartbeat_at=leases.stamp(),
            status=status,
            lease_owner=lease.owner if status == ShardStatus.RUNNING else None,
        )
        .returning(Shard.heartbeat_at)  # the database's now
        .execution_options(synchronize_session=False)
    ).scalar_one_or_none()
    if now is None:
        return None
    if chunk is not None:
        sequence, key, lines = chunk
        session.add(
            ResultChunk(
                shard_id=lease.shard_id,
                epoch=lease.epoch,
                sequence=sequence,
                storage_key=key,
                lines=lines,
                created_at=now,
                work=work_of(progress) if progress is not None else 0,
            )
        )
    work = work_of(progress) if progress is not None else 0
    if work:
        batch_status, expires_at = record_work(session, lease.batch_id, work)
    else:
        batch_status, expires_at = session.execute(
            select(Batch.status, Batch.expires_at).where(Batch.id == lease.batch_id)
        ).one()
    last = done and not session.scalar(
        select(exists().where(Shard.batch_id == lease.batch_id, Shard.status != ShardStatus.DONE))
    )
    return BatchState(batch_status, expires_at, checked_at=now, last_shard=bool(last))
