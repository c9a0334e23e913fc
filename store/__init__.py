"""The store: the authority on every job, item, lease, lock and event. All SQL lives here."""

from .engine import database_url, make_engine
from .errors import BacklogFull, StaleLease, StoreError, SubmissionError, UnknownJob

__all__ = [
    "BacklogFull",
    "StaleLease",
    "StoreError",
    "SubmissionError",
    "UnknownJob",
    "database_url",
    "make_engine",
]
