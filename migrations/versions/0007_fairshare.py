"""scheduling: project weights and fair-share clocks, deadlines at risk, ETAs and their record

Revision ID: 0007_fairshare
Revises: 0006_dash_fleet
Create Date: 2026-12-01 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_fairshare"
down_revision: str | None = "0006_dash_fleet"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH_COLUMNS = (
    sa.Column("work_done", sa.BigInteger(), server_default="0", nullable=False),
    sa.Column("vtime", sa.Float(), server_default="0", nullable=False),
    sa.Column("urgent_deadline", sa.BigInteger(), nullable=True),
    sa.Column("expected_miss", sa.Boolean(), server_default="0", nullable=False),
    sa.Column("eta_start_at", sa.Float(), nullable=True),
    sa.Column("eta_finish_at", sa.Float(), nullable=True),
    sa.Column("eta_made_at", sa.Float(), nullable=True),
)


def upgrade() -> None:
    with op.batch_alter_table("projects") as batch_op:
        batch_op.add_column(sa.Column("weight", sa.Float(), server_default="1", nullable=False))
    with op.batch_alter_table("batches") as batch_op:
        for column in _BATCH_COLUMNS:
            batch_op.add_column(column)
    with op.batch_alter_table("result_chunks") as batch_op:
        batch_op.add_column(sa.Column("work", sa.BigInteger(), server_default="0", nullable=False))
        batch_op.create_index("ix_result_chunks_created_at", ["created_at"])
    op.create_table(
        "project_shares",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("vtime", sa.Float(), nullable=False),
        sa.Column("work_done", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_project_shares_project_id_projects"
        ),
        sa.PrimaryKeyConstraint("project_id", "model", name="pk_project_shares"),
    )
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
    running = sa.text("status IN ('in_progress')")
    op.create_index(
        "ix_batches_running", "batches", ["model"], postgresql_where=running, sqlite_where=running
    )
    open_shards = sa.text("status IN ('pending', 'running')")
    op.create_index(
        "ix_shards_claim_order",
        "shards",
        ["batch_id", "index"],
        postgresql_where=open_shards,
        sqlite_where=open_shards,
    )


def downgrade() -> None:
    op.drop_index("ix_shards_claim_order", table_name="shards")
    op.drop_index("ix_batches_running", table_name="batches")
    op.drop_index("ix_batch_estimates_batch_id", table_name="batch_estimates")
    op.drop_table("batch_estimates")
    op.drop_table("project_shares")
    with op.batch_alter_table("result_chunks") as batch_op:
        batch_op.drop_index("ix_result_chunks_created_at")
        batch_op.drop_column("work")
    with op.batch_alter_table("batches") as batch_op:
        for column in reversed(_BATCH_COLUMNS):
            batch_op.drop_column(column.name)
    with op.batch_alter_table("projects") as batch_op:
        batch_op.drop_column("weight")
