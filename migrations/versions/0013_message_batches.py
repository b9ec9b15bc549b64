"""the API a batch was created through: OpenAI's Batches or Anthropic's Message Batches

Revision ID: 0013_message_batches
Revises: 0012_step_backoff
Create Date: 2026-12-04 12:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013_message_batches"
down_revision: str | None = "0012_step_backoff"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.add_column(
            sa.Column("api", sa.String(length=16), server_default="openai", nullable=False)
        )
        batch_op.create_check_constraint(
            op.f("ck_batches_api"), sa.text("api IN ('openai', 'anthropic')")
        )


def downgrade() -> None:
    with op.batch_alter_table("batches") as batch_op:
        batch_op.drop_constraint(op.f("ck_batches_api"), type_="check")
        batch_op.drop_column("api")
