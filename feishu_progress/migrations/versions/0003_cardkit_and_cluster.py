"""The CardKit entity of a card and the ownership of a card in cluster mode.

Revision ID: 0003_cardkit_and_cluster
Revises: 0002_long_text_and_idempotency
Create Date: 2026-12-01 00:00:00

- ``task_card.transport`` / ``card_id``: whether the card is a CardKit entity (streamed text) or a message
  PATCHed whole, and which entity.
- ``task_card.owner_instance`` / ``fence``: in cluster mode the one instance that writes the card, and the
  epoch bumped on every takeover (and every restart). A CardKit ``sequence`` is derived from it
  (``fence << 20 | n``), so Feishu itself refuses a stale writer.
- ``instance_lease``: each live instance's heartbeat and where its peers reach it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0003_cardkit_and_cluster"
down_revision: str | Sequence[str] | None = "0002_long_text_and_idempotency"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    with op.batch_alter_table("task_card") as batch:
        batch.add_column(sa.Column("transport", sa.String(16), nullable=True))
        batch.add_column(sa.Column("card_id", sa.String(64), nullable=True))
        batch.add_column(sa.Column("owner_instance", sa.String(64), nullable=True))
        batch.add_column(sa.Column("fence", sa.BigInteger(), server_default=sa.text("0"), nullable=False))
    op.create_index("ix_task_card_owner_instance", "task_card", ["owner_instance"])
    op.create_table(
        "instance_lease",
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("address", sa.String(255), nullable=True),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("heartbeat_at", UTC_DATETIME, nullable=False),
        sa.Column("expires_at", UTC_DATETIME, nullable=False),
        sa.Column("draining", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("instance_id", name="pk_instance_lease"),
        **MYSQL_TABLE,
    )
    op.create_index("ix_instance_lease_expires_at", "instance_lease", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_instance_lease_expires_at", table_name="instance_lease")
    op.drop_table("instance_lease")
    op.drop_index("ix_task_card_owner_instance", table_name="task_card")
    with op.batch_alter_table("task_card") as batch:
        for column in ("fence", "owner_instance", "card_id", "transport"):
            batch.drop_column(column)
