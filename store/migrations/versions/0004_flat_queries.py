"""flat queries: chunked submission columns; the hot paths seek in the indexes of 0001

Revision ID: 0004
Revises: 0001
Create Date: 2026-12-01 14:00:00

``jobs.submitting`` (+ ``photos``, ``landed``, ``submit_touched_at``): a job whose submission is
still landing in chunks; ``ix_jobs_submitting`` (partial): the backlog check's look at submissions
in flight. No new index on ``items``: the dispatcher (a row-value seek in ``ix_items_dispatch``
instead of ``DISTINCT job_id`` over every pending item), the sweeper's scans (ranges of
``ix_items_lease``) and bundle release (equality seeks in ``ix_items_job_state`` by the lane before,
instead of counting by the unindexed ``position``) now use the indexes of 0001 — every extra
index on ``items`` would cost every state change (see README "Flat queries").
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("submitting", sa.Boolean(), nullable=False, server_default=sa.text("false"))
        )
        batch_op.add_column(sa.Column("photos", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("landed", sa.Integer(), nullable=False, server_default=sa.text("0")))
        batch_op.add_column(sa.Column("submit_touched_at", sa.Float(), nullable=True))
        batch_op.create_index(
            "ix_jobs_submitting",
            ["id"],
            unique=False,
            postgresql_where=sa.text("submitting"),
            sqlite_where=sa.text("submitting = 1"),
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_submitting")
        batch_op.drop_column("submit_touched_at")
        batch_op.drop_column("landed")
        batch_op.drop_column("photos")
        batch_op.drop_column("submitting")
