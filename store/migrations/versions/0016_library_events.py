"""idempotency keys, job ends, webhook deliveries and schedules (issue 38, second half)

- ``idempotency_keys``: one row per ``Idempotency-Key`` a submission (``jobs``) or a sync
  (``sync``) was given: the SHA-256 of the request it came with and the job it made, written in the
  transaction that creates the job (``store.idempotency``); ``response`` is what the first request
  answered once it completed. Pruned after ``PHOTOJOBS_IDEMPOTENCY_KEEP``.
- ``job_ends``: one row per job whose ``job_finished`` event was written (``store.job_end``), so it is
  written once per finish; a retry that reopens the job deletes it. No foreign key: its insert must
  not lock the job row (it comes last in the lock order).
- ``webhook_state``: per webhook target (the SHA-256 of its URL), the event cursor delivered through,
  the current event's attempts and next attempt, the last answer, the counts, and the sweeper that
  holds the delivery (``owner`` until ``lease_expires_at``) (``store.webhooks``).
- ``schedules``: a named ``sync``/``submit`` command line run by the sweepers every ``every`` seconds
  or by ``cron``; ``next_run`` is the compare-and-set that makes one run per tick across fleets
  (``store.schedules``).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-07 07:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0016"
down_revision: str | Sequence[str] | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.String(16), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("request_sha256", sa.String(64), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("response", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("scope", "key"),
    )
    op.create_index("ix_idempotency_keys_created", "idempotency_keys", ["created_at"])
    op.create_table(
        "job_ends",
        sa.Column("job_id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("finished_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "webhook_state",
        sa.Column("target", sa.String(64), primary_key=True),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("cursor", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("next_attempt_at", sa.Float(), nullable=False, server_default=sa.text("0")),
        sa.Column("delivered", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("failures", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_attempt_at", sa.Float(), nullable=True),
        sa.Column("last_delivered_at", sa.Float(), nullable=True),
        sa.Column("owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.Float(), nullable=True),
    )
    op.create_table(
        "schedules",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("every", sa.Float(), nullable=True),
        sa.Column("cron", sa.String(128), nullable=True),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False, server_default=sa.text("false")),
        sa.Column("next_run", sa.Float(), nullable=False),
        sa.Column("last_run_at", sa.Float(), nullable=True),
        sa.Column("last_job", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("running_since", sa.Float(), nullable=True),
        sa.Column("runs", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("skipped", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("created_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("schedules")
    op.drop_table("webhook_state")
    op.drop_table("job_ends")
    op.drop_index("ix_idempotency_keys_created", table_name="idempotency_keys")
    op.drop_table("idempotency_keys")
