"""photo_files: what `photojobs sync` last saw of each photo on disk (issue 38)

- ``photo_files``: one row per photo a sync recorded: the file's identity as ``stat`` gives it
  (size, mtime in nanoseconds, inode, device), its content hash, the signature of its sidecars
  (their names, sizes, mtimes and inodes, and a hash of their content), when it was recorded, and
  per lane the version and job a sync last submitted it with (``lanes``: ``{LANE: [VERSION,
  JOB]}``). A sync compares a file's ``stat`` with this row and hashes the file only when they
  differ (``store.sync``). ``sha256`` is indexed: a new path whose content a recorded photo had,
  whose own path is gone, is that photo moved.
- ``photo_effects.job_id`` may be NULL: a move a sync found (a photo renamed or re-foldered by hand)
  is in the photo's history, but no job made it.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-08 09:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "photo_files",
        sa.Column("photo_id", sa.Integer(), sa.ForeignKey("photos.id"), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("mtime_ns", sa.BigInteger(), nullable=False),
        sa.Column("inode", sa.BigInteger(), nullable=False),
        sa.Column("device", sa.BigInteger(), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("sidecars", sa.Text(), nullable=True),
        sa.Column("sidecars_sha256", sa.String(64), nullable=True),
        sa.Column("lanes", sa.JSON(), nullable=True),
        sa.Column("recorded_at", sa.Float(), nullable=False),
    )
    op.create_index("ix_photo_files_sha256", "photo_files", ["sha256"])
    with op.batch_alter_table("photo_effects") as batch:
        batch.alter_column("job_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM photo_effects WHERE job_id IS NULL")
    with op.batch_alter_table("photo_effects") as batch:
        batch.alter_column("job_id", existing_type=sa.Integer(), nullable=False)
    op.drop_index("ix_photo_files_sha256", table_name="photo_files")
    op.drop_table("photo_files")
