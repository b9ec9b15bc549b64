"""online API usage per project and model (branch online)

Revision ID: 0008_online
Revises: 0007_fairshare
Create Date: 2026-12-01 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008_online"
down_revision: str | None = "0007_fairshare"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "online_usage",
        sa.Column("project_id", sa.String(length=64), nullable=False),
        sa.Column("model", sa.String(length=256), nullable=False),
        sa.Column("requests", sa.BigInteger(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["project_id"], ["projects.id"], name=op.f("fk_online_usage_project_id_projects")
        ),
        sa.PrimaryKeyConstraint("project_id", "model", name=op.f("pk_online_usage")),
    )


def downgrade() -> None:
    op.drop_table("online_usage")
