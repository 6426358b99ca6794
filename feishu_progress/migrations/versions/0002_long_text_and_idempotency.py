"""LONGTEXT where TEXT's 64 KiB lost data on MySQL; the Idempotency-Key of task creation.

Revision ID: 0002_long_text_and_idempotency
Revises: 0001_initial
Create Date: 2026-12-01 00:00:00

On MySQL/MariaDB a ``TEXT`` column holds 64 KiB: a snapshot with a long answer made the batched save
fail for every task, and a long answers payload was dropped after the user was told it was submitted.
SQLite's TEXT has no such limit, so only MySQL columns change type.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0002_long_text_and_idempotency"
down_revision: str | Sequence[str] | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LONG_COLUMNS = (
    ("task_card", "snapshot", True),
    ("task_action", "payload", False),
    ("subagent_execution", "task_description", True),
)


def _is_mysql() -> bool:
    return op.get_context().dialect.name in ("mysql", "mariadb")


def upgrade() -> None:
    if _is_mysql():
        for table, column, nullable in LONG_COLUMNS:
            op.alter_column(table, column, type_=mysql.LONGTEXT(), existing_nullable=nullable)
    op.add_column("task_card", sa.Column("idempotency_key", sa.String(191), nullable=True))
    op.create_index("uq_task_card_idempotency_key", "task_card", ["idempotency_key"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_task_card_idempotency_key", table_name="task_card")
    with op.batch_alter_table("task_card") as batch:
        batch.drop_column("idempotency_key")
    if _is_mysql():
        for table, column, nullable in LONG_COLUMNS:
            op.alter_column(table, column, type_=sa.Text(), existing_nullable=nullable)
