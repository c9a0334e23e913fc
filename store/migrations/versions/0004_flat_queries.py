"""flat queries: chunked submission columns; the hot paths seek in the indexes of 0001

Revision ID: 0004
Revises: 0003
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
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Plain ALTER TABLE ADD COLUMN, not a batch: on SQLite a batch copies and drops ``jobs``, and
    # dropping it with foreign keys on would cascade-delete every item.
    op.add_column("jobs", sa.Column("submitting", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.add_column("jobs", sa.Column("photos", sa.Integer(), nullable=True))
    op.add_column("jobs", sa.Column("landed", sa.Integer(), nullable=False, server_default=sa.text("0")))
    op.add_column("jobs", sa.Column("submit_touched_at", sa.Float(), nullable=True))
    op.create_index(
        "ix_jobs_submitting",
        "jobs",
        ["id"],
        unique=False,
        postgresql_where=sa.text("submitting"),
        sqlite_where=sa.text("submitting = 1"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_submitting", table_name="jobs")
    # SQLite >= 3.35 drops columns in place (no table copy, so no cascade).
    op.drop_column("jobs", "submit_touched_at")
    op.drop_column("jobs", "landed")
    op.drop_column("jobs", "photos")
    op.drop_column("jobs", "submitting")
