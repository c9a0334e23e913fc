"""Summaries of a job for displays and the run command: event counts, a lane's results, running items."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from .engine import reader
from .models import RUNNING, SUCCEEDED, Event, Item


def event_type_counts(engine: Engine, job_id: int, types: Sequence[str]) -> dict[str, int]:
    """How many events of each type the job has (e.g. lease_expired = recoveries)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Event.type, func.count())
            .where(Event.job_id == job_id, Event.type.in_(tuple(types)))
            .group_by(Event.type)
        ).all()
    return {t: 0 for t in types} | dict(rows)


def job_results(engine: Engine, job_id: int, lane: str) -> list[dict[str, Any]]:
    """The results of a lane's succeeded items (e.g. analysis facts, for near-duplicate groups)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.photo_id, Item.result).where(
                Item.job_id == job_id, Item.lane == lane, Item.state == SUCCEEDED
            )
        ).all()
    return [{"photo": pid, **(result or {})} for pid, result in rows]


def running_items(engine: Engine, job_id: int) -> list[dict[str, Any]]:
    """The job's running items with their lease owner (for the demo's worker kill and displays)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.id, Item.lane, Item.lease_owner).where(Item.job_id == job_id, Item.state == RUNNING)
        ).all()
    return [{"id": r.id, "lane": r.lane, "lease_owner": r.lease_owner} for r in rows]
