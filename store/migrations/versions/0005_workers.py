"""workers: a registry of worker processes, written by their heartbeat

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 15:00:00

One row per worker process (``id`` = its lease owner string ``host:pid:nonce``): the lanes it
serves, its heartbeat interval, when it started, its last beat (database clock), how many items it
held then, and when it stopped cleanly. ``GET /api/workers`` lists idle workers from it too; the
sweeper deletes rows whose beats stopped long ago (``ix_workers_last_beat``), so it stays small.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=128), nullable=False),
        sa.Column("host", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("lanes", sa.JSON(), nullable=False),
        sa.Column("interval", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.Column("last_beat", sa.Float(), nullable=False),
        sa.Column("items_held", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("stopped_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_workers_last_beat", "workers", ["last_beat"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_workers_last_beat", table_name="workers")
    op.drop_table("workers")
