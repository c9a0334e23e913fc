"""items.message_items: how many items the message of a queued item carries

A lane message may name several items (batch messages). The dispatcher keeps at most the lane's
bound of *messages* in Redis; it counts them from the queued items, each a 1/message_items share
of its message.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-04 11:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add the nullable items.message_items (NULL: a message of its own, as every message was)."""
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.add_column(sa.Column("message_items", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("items", schema=None) as batch_op:
        batch_op.drop_column("message_items")
