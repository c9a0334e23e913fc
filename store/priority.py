"""Which jobs go first: the interactive rule (an explicit ``jobs.priority`` or a small job) and the
interactive queue's bound."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sqlalchemy import case, literal_column

from store.lanes import LaneSpec

from .models import Job

# A job is interactive when it was submitted so (``jobs.priority``), or, submitted without a priority,
# when it has at most ``interactive_photos()`` photos: a one-photo upload goes first without anyone
# asking. Its items travel in the lane's interactive queue (``LaneSpec.interactive_queue``), bounded
# apart from the lane's (``interactive_bound``), consumed by an actor of a higher Dramatiq priority:
# they wait neither behind the lane's Redis backlog nor behind the workers' prefetched messages.
INTERACTIVE = "interactive"
NORMAL = "normal"
PRIORITIES = (INTERACTIVE, NORMAL)
INTERACTIVE_PHOTOS_ENV = "PHOTOJOBS_INTERACTIVE_PHOTOS"
INTERACTIVE_PHOTOS = 16
INTERACTIVE_BOUND_MIN = 16


def interactive_photos(env: Mapping[str, str] | None = None) -> int:
    """The most photos a job submitted without a priority may have to be interactive
    (``PHOTOJOBS_INTERACTIVE_PHOTOS``, default 16; 0: only an explicit priority)."""
    raw = (os.environ if env is None else env).get(INTERACTIVE_PHOTOS_ENV, "")
    try:
        return max(0, int(raw)) if raw.strip() else INTERACTIVE_PHOTOS
    except ValueError:
        return INTERACTIVE_PHOTOS


def is_interactive_sql(limit: int) -> Any:
    """The rule, as an SQL expression on ``jobs`` (1 interactive, 0 not): the one place it is written.
    ``limit``: ``interactive_photos()``."""
    one, zero = literal_column("1"), literal_column("0")  # constants in the text: GROUP BY repeats it
    return case(
        (Job.priority == literal_column(f"'{INTERACTIVE}'"), one),
        (Job.priority.is_(None) & (Job.photos <= literal_column(str(int(limit)))), one),
        else_=zero,
    )


def interactive_bound(spec: LaneSpec) -> int:
    """Most messages of the lane's interactive queue in Redis: two per thread of the fleet for the
    lane, at least ``INTERACTIVE_BOUND_MIN`` (a small job's retries each travel alone)."""
    return max(INTERACTIVE_BOUND_MIN, 2 * spec.threads * spec.fleet_processes)

