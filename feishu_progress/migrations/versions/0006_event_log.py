"""The event log: batches a live instance stored for a card whose writer did not answer (cluster mode).

Revision ID: 0006_event_log
Revises: 0005_task_app
Create Date: 2026-12-02 00:00:00

- ``task_event_log``: one row per accepted batch, keyed by (session_id, seq), with its Idempotency-Key;
  the card's writer applies them in order and deletes them.
- ``task_card.events_logged``: the newest ``seq`` of the task, bumped in the appending transaction (so a
  task's sequence never has a gap or a reused number, even after applied rows are deleted).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

revision: str = "0006_event_log"
down_revision: str | Sequence[str] | None = "0005_task_app"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

UTC_DATETIME = sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
LONG_TEXT = sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb")
MYSQL_TABLE: dict[str, Any] = {"mysql_engine": "InnoDB", "mysql_charset": "utf8mb4", "mysql_collate": "utf8mb4_bin"}


def utc_now() -> sa.TextClause:
    """The dialect's current-UTC-time default (SQLite CURRENT_TIMESTAMP drops the fraction)."""
    if op.get_context().dialect.name == "sqlite":
        return sa.text("(STRFTIME('%Y-%m-%d %H:%M:%f', 'now'))")
    return sa.text("(UTC_TIMESTAMP(6))")


def upgrade() -> None:
    with op.batch_alter_table("task_card") as batch:
        batch.add_column(
            sa.Column("events_logged", sa.BigInteger(), server_default=sa.text("0"), nullable=False)
        )
    op.create_table(
        "task_event_log",
        sa.Column("session_id", sa.BigInteger(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("idempotency_key", sa.String(255), nullable=True),
        sa.Column("body", LONG_TEXT, nullable=False),
        sa.Column("created_at", UTC_DATETIME, server_default=utc_now(), nullable=False),
        sa.PrimaryKeyConstraint("session_id", "seq", name="pk_task_event_log"),
        **MYSQL_TABLE,
    )


def downgrade() -> None:
    op.drop_table("task_event_log")
    with op.batch_alter_table("task_card") as batch:
        batch.drop_column("events_logged")
