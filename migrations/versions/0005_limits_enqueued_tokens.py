"""a shard's estimated prompt tokens, for the enqueued-token limits

Revision ID: 0005_limits
Revises: 0004
Create Date: 2026-12-01 13:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_limits"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("shards") as batch_op:
        batch_op.add_column(
            sa.Column("prompt_tokens", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("shards") as batch_op:
        batch_op.drop_column("prompt_tokens")
