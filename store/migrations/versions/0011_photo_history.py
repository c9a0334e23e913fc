"""photo_history: the effect log behind per-photo history and undo (issue 31)

``photo_effects``: one row per file effect a job applied (written in the transaction that marks its
intent applied, ``store.history.log_applied``); ``intents.detail``: what that row needs and only
the worker knows when it records the intent (changed tags, the kept original, the undone effect).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05 11:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("intents") as batch:
        batch.add_column(sa.Column("detail", sa.JSON(), nullable=True))
    op.create_table(
        "photo_effects",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("photo_id", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("item_id", sa.Integer(), nullable=False),
        sa.Column("intent_id", sa.Integer(), nullable=False, unique=True),
        sa.Column("lane", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("effect", sa.String(16), nullable=False),
        sa.Column("sidecar", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("from_path", sa.Text(), nullable=True),
        sa.Column("to_path", sa.Text(), nullable=False),
        sa.Column("before_sha256", sa.String(64), nullable=True),
        sa.Column("after_sha256", sa.String(64), nullable=True),
        sa.Column("changes", sa.JSON(), nullable=True),
        sa.Column("kept", sa.Text(), nullable=True),
        sa.Column("undoes", sa.Integer(), nullable=True),
        sa.Column("undone_by", sa.Integer(), nullable=True),
        sa.Column("at", sa.Float(), nullable=False),
    )
    op.create_index("ix_photo_effects_photo", "photo_effects", ["photo_id", "id"])
    op.create_index("ix_photo_effects_job", "photo_effects", ["job_id", "lane"])


def downgrade() -> None:
    op.drop_index("ix_photo_effects_job", table_name="photo_effects")
    op.drop_index("ix_photo_effects_photo", table_name="photo_effects")
    op.drop_table("photo_effects")
    with op.batch_alter_table("intents") as batch:
        batch.drop_column("detail")
