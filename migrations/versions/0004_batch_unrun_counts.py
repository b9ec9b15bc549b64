"""count a batch's cancelled and expired requests apart from its failed ones

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 11:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.add_column(
            sa.Column("cancelled", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("expired", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_column("expired")
        batch_op.drop_column("cancelled")
