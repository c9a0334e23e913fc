"""lane_control: lanes paused across all jobs, and job priority (issue 24; filled by the lanes/priority work)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 22:50:00

"""

from collections.abc import Sequence

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Nothing yet."""


def downgrade() -> None:
    """Nothing yet."""
