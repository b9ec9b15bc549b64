"""record when a worker's engine was up, so a loading worker is listed as loading

Revision ID: 0006_dash_fleet
Revises: 0005_limits
Create Date: 2026-12-01 13:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_dash_fleet"
down_revision: str | None = "0005_limits"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch_op:
        batch_op.add_column(sa.Column("ready_at", sa.Float(), nullable=True))
    # Workers registered before this column existed had their engine up.
    op.execute("UPDATE workers SET ready_at = started_at")


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch_op:
        batch_op.drop_column("ready_at")
