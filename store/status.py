"""Job status: item counts per lane and state, and the job state derived from them (the one place)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import UnknownJob
from .models import (
    ALL_STATES,
    CANCEL,
    CANCELLED,
    FAILED,
    PAUSE,
    PAUSED,
    PENDING,
    QUEUED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    WAITING,
    Item,
    Job,
)


@dataclass
class JobStatus:
    job_id: int
    state: str
    control: str | None
    lanes: dict[str, dict[str, int]] = field(default_factory=dict)
    lane_order: list[str] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    # While the job's photos are still landing: {"photos": announced, "landed": written,
    # "idle": seconds since the last chunk (database clock)}; None once submitted.
    submission: dict[str, Any] | None = None
    # Why its items wait (``store.waiting``): [{"lane", "reason", "items", …}]; None: not asked.
    waiting: list[dict[str, Any]] | None = None
    # The reason shown instead of ``running`` when none of its items can move (``waiting (REASON)``).
    waiting_for: str | None = None

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(ALL_STATES, 0)
        for counts in self.lanes.values():
            for st, n in counts.items():
                out[st] += n
        return out

    def as_dict(self) -> dict[str, Any]:
        out = {"job": self.job_id, "state": self.state, "control": self.control, "lanes": self.lanes}
        if self.submission is not None:
            out["submission"] = self.submission
        if self.waiting is not None:
            out["waiting"] = self.waiting
            out["waiting_for"] = self.waiting_for
        return out

    def shown_state(self) -> str:
        """The state as the console, the jobs list and ``status`` show it: ``waiting (lane paused)``
        instead of ``running`` when nothing of the job can move."""
        return f"waiting ({self.waiting_for})" if self.waiting_for else self.state


def derive_job_state(control: str | None, totals: Mapping[str, int], submitting: bool = False) -> str:
    """A job's state follows from its items and its control request (one place decides it).

    ``submitting``: its photos are still landing (or its submitter died half-way); nothing of it
    runs until the submission completes. A cancel ends that like any other state.
    """
    if submitting and control != CANCEL:
        return "submitting"
    if control == PAUSE:
        # Pause stops pending/queued items at once and running ones at a safe point; a waiting item
        # (a later lane of a paused photo) cannot move until the job resumes.
        return "pausing" if totals.get(RUNNING, 0) else "paused"
    active = sum(totals.get(s, 0) for s in (WAITING, PENDING, QUEUED, RUNNING))
    if active:
        return "cancelling" if control == CANCEL else "running"
    if totals.get(PAUSED, 0):
        return "paused"
    if control == CANCEL or totals.get(CANCELLED, 0):
        return "cancelled"
    total = sum(totals.values())
    if totals.get(SUCCEEDED, 0) == total:
        return "succeeded"
    if totals.get(FAILED, 0) + totals.get(SKIPPED, 0) == total:
        return "failed"
    return "partial"


def job_status(engine: Engine, job_id: int) -> JobStatus:
    with Session(reader(engine)) as s:
        job = s.get(Job, job_id)
        if job is None:
            raise UnknownJob(job_id)
        return statuses(s, [job])[0]


def statuses(s: Session, jobs: Sequence[Job]) -> list[JobStatus]:
    """The status of each of ``jobs`` (item counts per lane and state in one query, the derived
    state, and a submission still landing): the one place a job's status is computed."""
    ids = [j.id for j in jobs]
    counts: dict[int, dict[str, dict[str, int]]] = {i: {} for i in ids}
    if ids:
        for job_id, lane, state, n in s.execute(
            select(Item.job_id, Item.lane, Item.state, func.count())
            .where(Item.job_id.in_(ids))
            .group_by(Item.job_id, Item.lane, Item.state)
        ):
            counts[job_id].setdefault(lane, {})[state] = n
    now: float | None = None
    out = []
    for job in jobs:
        lanes: dict[str, dict[str, int]] = {name: {} for name in job.lanes}
        for lane, by_state in counts[job.id].items():
            lanes.setdefault(lane, {}).update(by_state)
        status = JobStatus(
            job_id=job.id,
            state="",
            control=job.control,
            lanes=lanes,
            lane_order=list(job.lanes),
            params=dict(job.params or {}),
            created_at=job.created_at,
        )
        if job.submitting and job.control != CANCEL:  # a cancelled one is over, landed or not
            if now is None:
                now = s.execute(select(db_now())).scalar_one()
            idle = now - (job.submit_touched_at or job.created_at)
            status.submission = {"photos": job.photos, "landed": job.landed, "idle": round(idle, 1)}
        status.state = derive_job_state(job.control, status.totals(), job.submitting)
        out.append(status)
    return out


def list_jobs(engine: Engine, limit: int = 20) -> list[JobStatus]:
    with Session(reader(engine)) as s:
        ids = s.execute(select(Job.id).order_by(Job.id.desc()).limit(limit)).scalars().all()
    return [job_status(engine, i) for i in ids]
