"""A digest of the create request kept with its Idempotency-Key.

Revision ID: 0007_request_digest
Revises: 0006_event_log
Create Date: 2026-12-02 00:00:00

- ``task_card.request_digest``: the key sent again with another request (another chat, another
  requester) is refused instead of answering with the task the key first made. NULL for tasks created
  before: their key answers as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007_request_digest"
down_revision: str | Sequence[str] | None = "0006_event_log"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("task_card") as batch:
        batch.add_column(sa.Column("request_digest", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("task_card") as batch:
        batch.drop_column("request_digest")
