"""intents own their photo: content hashes on intents, photo locks held by an intent

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 14:00:00

- ``intents.sha256`` becomes ``intents.result_sha256`` (the content the effect produces) and
  ``intents.base_sha256`` is added (the content the photo had when the effect was planned; NULL
  for intents recorded before this revision: recovery then trusts the staged file, as 0001 did).
- ``photo_locks.intent_id``: set when a lock outlives its item's lease because the item has an
  unsettled intent; the lock is released when that intent is settled.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTERs (PostgreSQL, and SQLite >= 3.25) keep the partial unique index on live targets.
    op.execute("ALTER TABLE intents RENAME COLUMN sha256 TO result_sha256")
    op.add_column("intents", sa.Column("base_sha256", sa.String(length=64), nullable=True))
    op.create_index("ix_intents_live", "intents", ["state", "item_id"], unique=False)
    op.add_column("photo_locks", sa.Column("intent_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("photo_locks", "intent_id")
    op.drop_index("ix_intents_live", table_name="intents")
    op.drop_column("intents", "base_sha256")
    op.execute("ALTER TABLE intents RENAME COLUMN result_sha256 TO sha256")
