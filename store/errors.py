"""Errors raised by the store."""

from __future__ import annotations


class StoreError(Exception):
    """Base class of the store's errors."""


class StaleLease(StoreError):
    """A commit was attempted under a lease that no longer holds (token moved on or item not running)."""

    def __init__(
        self, item_id: int, token: int, current_state: str | None, current_token: int | None
    ) -> None:
        self.item_id = item_id
        self.token = token
        self.current_state = current_state
        self.current_token = current_token
        super().__init__(
            f"stale lease on item {item_id}: held token {token}, item is now "
            f"{current_state or 'missing'} with token {current_token}"
        )


class SubmissionError(StoreError, ValueError):
    """Submission refused for bad input (no photos, a path outside the roots, an unknown lane)."""


class BacklogFull(SubmissionError):
    """Submission refused: a lane's backlog would exceed its bound (retry later: HTTP 429)."""

    def __init__(self, lane: str, backlog: int, adding: int, bound: int) -> None:
        self.lane = lane
        self.backlog = backlog
        self.adding = adding
        self.bound = bound
        super().__init__(
            f"lane {lane!r} is full: {backlog} items waiting + {adding} new would exceed its backlog bound "
            f"of {bound}; retry later or raise PHOTOJOBS_LANE_{lane.upper()}_BACKLOG"
        )


class UnknownJob(StoreError):
    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"no job with id {job_id}")


class NotApplicable(StoreError):
    """A control action that does not apply to the job as it is (resume a cancelled job: HTTP 409)."""
