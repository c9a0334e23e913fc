"""console_indexes: the console's job state and filters, with indexes (issue 24; filled by the console work)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04 22:50:00

"""

from collections.abc import Sequence

# revision identifiers, used by Alembic.
revision: str = "0010"
down_revision: str | Sequence[str] | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing yet."""


def downgrade() -> None:
    """Nothing yet."""
