"""console_indexes: the console's job state filter through a partial index on settled items (issue 24)

A job's state is derived from its items; the console's state filter asks which jobs have an item in
given states (``store.console.state_hint``). The rare settled states (failed, skipped, cancelled,
paused) get a partial index on (state, job_id); the active ones are served by ``ix_items_dispatch``.
An item that is claimed and succeeds never enters this index: the hot path pays nothing for it.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 22:50:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Word for word as store.console.SETTLED_PREDICATE (SQLite matches a partial index's terms exactly).
PREDICATE = "items.state IN ('failed', 'skipped', 'cancelled', 'paused')"


def upgrade() -> None:
    """``ix_items_settled_job``: which jobs have a failed, skipped, cancelled or paused item."""
    op.create_index(
        "ix_items_settled_job",
        "items",
        ["state", "job_id"],
        postgresql_where=sa.text(PREDICATE),
        sqlite_where=sa.text(PREDICATE),
    )


def downgrade() -> None:
    op.drop_index("ix_items_settled_job", table_name="items")
