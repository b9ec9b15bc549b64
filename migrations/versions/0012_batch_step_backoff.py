"""per-batch backoff of a batch-level step that keeps failing (finalization)

Revision ID: 0012_step_backoff
Revises: 0011_quotas
Create Date: 2026-12-09 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_step_backoff"
down_revision: str | None = "0011_quotas"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.add_column(
            sa.Column("step_failures", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("step_retry_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_column("step_retry_at")
        batch_op.drop_column("step_failures")
