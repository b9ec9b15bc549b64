"""drop batch_estimates: the planner's estimates are held against the truth from outside

Revision ID: 0014_drop_batch_estimates
Revises: 0013_message_batches
Create Date: 2026-12-04 16:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014_drop_batch_estimates"
down_revision: str | None = "0013_message_batches"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.drop_index("ix_batch_estimates_batch_id", table_name="batch_estimates")
    op.drop_table("batch_estimates")


def downgrade() -> None:
    op.create_table(
        "batch_estimates",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("batch_id", sa.String(64), nullable=False),
        sa.Column("made_at", sa.Float(), nullable=False),
        sa.Column("done", sa.Integer(), nullable=False),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("start_at", sa.Float(), nullable=True),
        sa.Column("finish_at", sa.Float(), nullable=True),
        sa.Column("expected_miss", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(
            ["batch_id"], ["batches.id"], name="fk_batch_estimates_batch_id_batches"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_batch_estimates"),
    )
    op.create_index("ix_batch_estimates_batch_id", "batch_estimates", ["batch_id"])
