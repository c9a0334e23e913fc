"""counters: persisted metric counters that never go backwards (issue 24)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 22:50:00

One row per (event type, lane) with how many such events ``store.counters.fold`` has folded from
the event log, and one row (``#cursor``, ``""``) with the cursor (``events.seq``) folded through.
It starts at 0, so the first fold counts the events already in the store. ``photojobs prune``
folds before it deletes events, so a prune never takes anything off a counter.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    counters = op.create_table(
        "counters",
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("lane", sa.String(length=32), nullable=False),
        sa.Column("value", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("name", "lane"),
    )
    op.bulk_insert(counters, [{"name": "#cursor", "lane": "", "value": 0}])


def downgrade() -> None:
    op.drop_table("counters")
