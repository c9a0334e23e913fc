"""counters: persisted metric counters that never go backwards (issue 24; filled by the metrics work)

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-04 22:50:00

"""

from collections.abc import Sequence

# revision identifiers, used by Alembic.
revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing yet."""


def downgrade() -> None:
    """Nothing yet."""
