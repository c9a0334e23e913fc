"""photos.file_time: the file's modification time recorded at submission

Rename falls back to this time for a photo without a capture time, so its name does not follow
later edits of the file.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 14:30:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the nullable photos.file_time (existing photos get theirs at their next submission)."""
    with op.batch_alter_table("photos", schema=None) as batch_op:
        batch_op.add_column(sa.Column("file_time", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("photos", schema=None) as batch_op:
        batch_op.drop_column("file_time")
