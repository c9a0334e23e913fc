"""lane_control: lanes paused across all jobs, and a job's priority (issue 24)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04 22:50:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """One row per lane ever paused; ``paused_at`` set while it is paused (``store.lane_control``)."""
    op.create_table(
        "lane_control",
        sa.Column("lane", sa.String(length=32), nullable=False),
        sa.Column("paused_at", sa.Float(), nullable=True),
        sa.Column("paused_by", sa.String(length=128), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("lane"),
    )
    # 'interactive' or 'normal' as submitted; NULL: by its size (``store.dispatch.is_interactive``).
    op.add_column("jobs", sa.Column("priority", sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("priority")
    op.drop_table("lane_control")
