"""Jobs, re-exported: submission (``store.submission``), status (``store.status``), control
(``store.control``: cancel / pause / resume) and summaries (``store.summaries``).

New code imports from the implementing module; this one keeps existing callers working.
"""

from __future__ import annotations

from .control import cancel, pause, resume
from .status import JobStatus, derive_job_state, job_status, list_jobs, statuses
from .submission import (
    PhotoInput,
    SubmissionCancelled,
    Submitted,
    find_job_by_fingerprint,
    job_fingerprint,
    submit,
)
from .summaries import event_type_counts, job_results, running_items

__all__ = [
    "JobStatus",
    "PhotoInput",
    "SubmissionCancelled",
    "Submitted",
    "cancel",
    "derive_job_state",
    "event_type_counts",
    "find_job_by_fingerprint",
    "job_fingerprint",
    "job_results",
    "job_status",
    "list_jobs",
    "pause",
    "resume",
    "running_items",
    "statuses",
    "submit",
]
