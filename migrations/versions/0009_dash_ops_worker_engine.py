"""a worker's engine (its configuration, its scheduler's latest gauges) and its shards

Revision ID: 0009_dash_ops
Revises: 0008_online
Create Date: 2026-12-01 13:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_dash_ops"
down_revision: str | None = "0008_online"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch_op:
        batch_op.add_column(sa.Column("engine_configuration", sa.JSON(), nullable=True))
        batch_op.add_column(
            sa.Column("engine_running", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("engine_waiting", sa.Integer(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("kv_cache_usage", sa.Float(), server_default="0", nullable=False)
        )
    with op.batch_alter_table("shards") as batch_op:
        batch_op.add_column(sa.Column("last_owner", sa.String(length=128), nullable=True))
        batch_op.create_index("ix_shards_last_owner", ["last_owner", "heartbeat_at"])


def downgrade() -> None:
    with op.batch_alter_table("shards") as batch_op:
        batch_op.drop_index("ix_shards_last_owner")
        batch_op.drop_column("last_owner")
    with op.batch_alter_table("workers") as batch_op:
        batch_op.drop_column("kv_cache_usage")
        batch_op.drop_column("engine_waiting")
        batch_op.drop_column("engine_running")
        batch_op.drop_column("engine_configuration")
