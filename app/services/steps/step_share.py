"""Fair share of the batch-level steps (validation, finalization) across projects.

Workers take shards by project clock (`app.services.schedule`); the validator and the
finalizer take whole batches, and took the oldest first, so one project's thousand queued
files held every other project's batches back for hours. They now take them as the shard
claim does: each project keeps a clock per step, the work of its batches the step took up
(their input bytes, plus a fixed cost per batch) divided by its weight, moved in the
transaction that claims each batch; the next batch is the oldest of the project with the
lowest clock. A project that had nothing waiting comes back at the lowest clock of those that
have (as `schedule.admit` does for shards): idle time is not banked. `fifo` keeps the oldest
batch first.
"""

from typing import TypeVarTuple

from sqlalchemy import ColumnElement, Select, func, select, update
from sqlalchemy.orm import Session

from app.core.schedule import Order
from app.core.states import BatchStep
from app.db import upsert
from app.db.models import Batch, File, Project, ProjectStepShare

# A batch's fixed cost to a step (its transactions, opening its files), as bytes read: a
# project's many tiny batches are not free.
BATCH_COST_BYTES = 1 << 20

Columns = TypeVarTuple("Columns")


def in_order(query: Select[*Columns], step: BatchStep, order: Order) -> Select[*Columns]:
    """`query` over batches, in the order `step` takes them: the lowest project clock, then
    the oldest batch (`fifo`: the oldest batch)."""
    if order is Order.FIFO:
        return query.order_by(Batch.seq)
    clock = (ProjectStepShare.project_id == Batch.project_id) & (ProjectStepShare.step == step)
    return query.outerjoin(ProjectStepShare, clock).order_by(
        func.coalesce(ProjectStepShare.vtime, 0.0), Batch.seq
    )


def charge(
    session: Session, step: BatchStep, batch_id: str, waiting: ColumnElement[bool], order: Order
) -> None:
    """Moves the clock of the batch's project on `step` by the batch's work, in the claim's
    transaction. `waiting`: the batches the step has yet to take (a condition on `Batch`)."""
    if order is Order.FIFO:
        return
    project_id, weight, size = session.execute(
        select(Batch.project_id, Project.weight, File.bytes)
        .join(Project, Project.id == Batch.project_id)
        .join(File, File.id == Batch.input_file_id)
        .where(Batch.id == batch_id)
    ).one()
    values = {"project_id": project_id, "step": step, "vtime": 0.0}
    session.execute(
        upsert.insert(session, ProjectStepShare).values(values).on_conflict_do_nothing()
    )
    mine = (ProjectStepShare.project_id == project_id) & (ProjectStepShare.step == step)
    clock = session.scalar(select(ProjectStepShare.vtime).where(mine).with_for_update())
    others = session.scalar(
        select(func.min(ProjectStepShare.vtime)).where(
            ProjectStepShare.step == step,
            ProjectStepShare.project_id != project_id,
            ProjectStepShare.project_id.in_(select(Batch.project_id).where(waiting)),
        )
    )
    start = max(clock or 0.0, others if others is not None else 0.0)
    session.execute(
        update(ProjectStepShare)
        .where(mine)
        .values(vtime=start + (size + BATCH_COST_BYTES) / weight)
        .execution_options(synchronize_session=False)
    )
