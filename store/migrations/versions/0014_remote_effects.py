"""remote_effects: uploads to an S3-compatible target in the effect log (issue 31, round two)

- ``photo_effects.intent_id`` may be NULL: a remote upload is no intent (nothing local is staged
  or moved); its row is written by ``store.history.log_remote`` in the fenced transaction that
  marks the upload item succeeded, and so is the row of an undo that deleted the remote copy.
- ``photo_effects.remote``: what identifies the remote object the job left (target name, bucket,
  key, ETag, size, whether the job created it), compared before an undo deletes it.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 12:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0014"
down_revision: str | Sequence[str] | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("photo_effects") as batch:
        batch.alter_column("intent_id", existing_type=sa.Integer(), nullable=True)
        batch.add_column(sa.Column("remote", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM photo_effects WHERE intent_id IS NULL")
    with op.batch_alter_table("photo_effects") as batch:
        batch.drop_column("remote")
        batch.alter_column("intent_id", existing_type=sa.Integer(), nullable=False)
