"""batch_schedules: a batch's clocks and ETAs leave the batches row

Checkpoints and the planner write the schedule's own row; the `batches` row keeps the API's
object and the batch-level steps' lease.

Revision ID: 0016_batch_schedules
Revises: 0015_shard_adapters
Create Date: 2026-12-04 22:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016_batch_schedules"
down_revision: str | None = "0015_shard_adapters"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("work_done", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("vtime", sa.Float(), server_default="0", nullable=False),
        sa.Column("urgent_deadline", sa.BigInteger(), nullable=True),
        sa.Column("expected_miss", sa.Boolean(), server_default="0", nullable=False),
        sa.Column("eta_start_at", sa.Float(), nullable=True),
        sa.Column("eta_finish_at", sa.Float(), nullable=True),
        sa.Column("eta_made_at", sa.Float(), nullable=True),
    ]


_NAMES = ", ".join(c.name for c in _columns())


def upgrade() -> None:
    op.create_table(
        "batch_schedules",
        sa.Column("batch_id", sa.String(64), nullable=False),
        *_columns(),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name="fk_batch_schedules_batch_id_batches"
        ),
        sa.PrimaryKeyConstraint("batch_id", name="pk_batch_schedules"),
    )
    op.execute(f"INSERT INTO batch_schedules (batch_id, {_NAMES}) SELECT id, {_NAMES} FROM batches")
    with op.batch_alter_table("batches") as batch_op:
        for column in reversed(_columns()):
            batch_op.drop_column(column.name)


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        for column in _columns():
            batch_op.add_column(column)
    copied = ", ".join(
        f"{c.name} = COALESCE((SELECT s.{c.name} FROM batch_schedules s "
        f"WHERE s.batch_id = batches.id), batches.{c.name})"
        for c in _columns()
    )
    op.execute(f"UPDATE batches SET {copied}")
    op.drop_table("batch_schedules")
