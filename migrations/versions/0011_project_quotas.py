"""per-project quotas (stored bytes, files, open uploads, unfinished batches); fair-share
clocks of the batch-level steps

Revision ID: 0011_quotas
Revises: 0010_sched
Create Date: 2026-12-08 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011_quotas"
down_revision: str | None = "0010_sched"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_QUOTAS = ("max_stored_bytes", "max_files", "max_open_uploads", "max_unfinished_batches")


def upgrade() -> None:
    with op.batch_alter_table("projects") as batch_op:
        for name in _QUOTAS:
            batch_op.add_column(sa.Column(name, sa.BigInteger(), nullable=True))
    op.create_table(
        "project_step_shares",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("step", sa.String(16), nullable=False),
        sa.Column("vtime", sa.Float(), nullable=False),
        sa.CheckConstraint(
            "step IN ('validation', 'finalization')", name=op.f("ck_project_step_shares_step")
        ),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_project_step_shares_project_id_projects"
        ),
        sa.PrimaryKeyConstraint("project_id", "step", name="pk_project_step_shares"),
    )


def downgrade() -> None:
    op.drop_table("project_step_shares")
    with op.batch_alter_table("projects") as batch_op:
        for name in reversed(_QUOTAS):
            batch_op.drop_column(name)
