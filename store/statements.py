"""Re-export of the dispatcher's statements from ``store.queries`` (where every protocol statement now
lives) for ``photojobs/testing/scale.py``, until it imports them from there."""

from __future__ import annotations

from .queries import mark_queued_sql, next_pending_job_sql, pending_of_job_sql, queued_count_sql

__all__ = ["mark_queued_sql", "next_pending_job_sql", "pending_of_job_sql", "queued_count_sql"]
