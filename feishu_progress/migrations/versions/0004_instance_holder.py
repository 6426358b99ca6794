"""The one process that owns a database in single mode.

Revision ID: 0004_instance_holder
Revises: 0003_cardkit_and_cluster
Create Date: 2026-12-02 00:00:00

- ``instance_holder``: at most one row: who serves this database without cluster mode (instance id,
  host, pid), with a heartbeat on the database's clock. A second single-mode ``serve`` refuses while
  the heartbeat is fresh and takes over a stale one (the holder crashed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0004_instance_holder"
down_revision: str | Sequence[str] | None = "0003_cardkit_and_cluster"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def upgrade() -> None:
    op.create_table(
        "instance_holder",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("token", sa.String(64), nullable=False),
        sa.Column("instance_id", sa.String(64), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", UTC_DATETIME, nullable=False),
        sa.Column("heartbeat_at", UTC_DATETIME, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_instance_holder"),
        **MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("instance_holder")
