"""shard_adapters: the LoRA adapters each shard's lines name, for claims that prefer shards
whose adapters a worker has loaded

Revision ID: 0015_shard_adapters
Revises: 0014_drop_batch_estimates
Create Date: 2026-12-10 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015_shard_adapters"
down_revision: str | None = "0014_drop_batch_estimates"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "shard_adapters",
        sa.Column("shard_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["shard_id"], ["shards.id"], name="fk_shard_adapters_shard_id_shards"
        ),
        sa.PrimaryKeyConstraint("shard_id", "name", name="pk_shard_adapters"),
    )


def downgrade() -> None:
    op.drop_table("shard_adapters")
