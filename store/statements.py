"""Re-export of ``store.queries`` (where every protocol statement now lives) for callers not yet moved."""

from __future__ import annotations

from .queries import (
    DROP_LOCKS,
    DROP_LOCKS_UNLESS_INTENT,
    JOB_DISPATCHABLE,
    LIVE_INTENT,
    LOCKS_TO_INTENT,
    RENEW_KEY,
    claim_sql,
    end_lease_sql,
    event_sql,
    mark_queued_sql,
    message_items_sql,
    next_pending_job_sql,
    pending_of_job_sql,
    photo_hash_sql,
    queued_count_sql,
    renew_sql,
    sql_now,
)

__all__ = [
    "DROP_LOCKS",
    "DROP_LOCKS_UNLESS_INTENT",
    "JOB_DISPATCHABLE",
    "LIVE_INTENT",
    "LOCKS_TO_INTENT",
    "RENEW_KEY",
    "claim_sql",
    "end_lease_sql",
    "event_sql",
    "mark_queued_sql",
    "message_items_sql",
    "next_pending_job_sql",
    "pending_of_job_sql",
    "photo_hash_sql",
    "queued_count_sql",
    "renew_sql",
    "sql_now",
]
