"""The Feishu/Lark app each card belongs to (several apps in one deployment).

Revision ID: 0005_task_app
Revises: 0004_instance_holder
Create Date: 2026-12-02 00:00:00

- ``task_card.app``: the name of the app (FP_APPS_FILE; ``default`` is FP_FEISHU__*) that sent the card
  and writes it. Every row from before belongs to ``default``, the only app there was.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005_task_app"
down_revision: str | Sequence[str] | None = "0004_instance_holder"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("task_card") as batch:
        batch.add_column(sa.Column("app", sa.String(64), server_default=sa.text("'default'"), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("task_card") as batch:
        batch.drop_column("app")
