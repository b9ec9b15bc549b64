"""the planner's lease (one pass at a time across API replicas); per-project enqueued limits

Revision ID: 0010_sched
Revises: 0009_dash_ops
Create Date: 2026-12-01 17:45:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010_sched"
down_revision: str | None = "0009_dash_ops"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "singleton_leases",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("expires_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_singleton_leases"),
    )
    op.create_table(
        "project_limits",
        sa.Column("project_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(256), nullable=False),
        sa.Column("token_limit", sa.BigInteger(), nullable=True),
        sa.Column("request_limit", sa.BigInteger(), nullable=True),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name="fk_project_limits_project_id_projects"
        ),
        sa.PrimaryKeyConstraint("project_id", "model", name="pk_project_limits"),
    )


def downgrade() -> None:
    op.drop_table("project_limits")
    op.drop_table("singleton_leases")
