"""console_round_two: an item's ready time at its claim, and what each worker thread runs (issue 33)

- ``items.ready_at``: when the item's current attempt became ready (its ``updated_at`` before the
  claim, which queuing and deferrals keep), written by the claim's compare-and-set from the
  row's old values (no extra statement): the claim's ``item_claimed`` event carries the queue wait
  (ready -> claim) that ``/metrics`` folds into ``photojobs_item_queue_wait_seconds``.
- ``workers.threads``: the worker process's thread count; ``workers.running``: what each of its
  threads runs at its latest beat (``[{"thread", "item", "age"}]``), written by the beat's one
  upsert (``store.workers.beat``), so the console names the job and item each busy thread runs.

Revision ID: 0013
Revises: 0010
Create Date: 2026-12-05 10:40:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

# revision identifiers, used by Alembic.
revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("items") as batch_op:
        batch_op.add_column(sa.Column("ready_at", sa.Float(), nullable=True))
    with op.batch_alter_table("workers") as batch_op:
        batch_op.add_column(sa.Column("threads", sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column("running", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch_op:
        batch_op.drop_column("running")
        batch_op.drop_column("threads")
    with op.batch_alter_table("items") as batch_op:
        batch_op.drop_column("ready_at")
