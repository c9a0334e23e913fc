"""Why a job's items are not moving (issue 41): per job and lane, the items that wait and why.

A job that shows ``running`` at 0/40 for nine minutes needs a reason next to it. Each entry is
``{"lane", "reason", "items", …}``, one of:

- ``job paused``: the job is paused (its items ``paused``);
- ``lane paused``: the lane is paused for every job (``store.lane_control``): its pending and queued
  items are held, ``since`` when;
- ``no live worker``: no live worker serves the lane (the registry, ``store.workers``: a worker is
  live while its beats are fresh, as the Workers view says), ``workers`` = 0;
- ``photo locked``: pending items whose photo another job's item holds (``store.photo_locks``),
  ``jobs`` = the holding jobs;
- ``backoff``: pending items told to wait before their next attempt (a retry's backoff, a deferral),
  ``until`` = when the last of them may run (database clock).

A lane paused or served by nobody is named once for all its held items (a backoff behind it does not
matter until it moves). :func:`nothing_moves` says whether every item that could run is held: the
jobs list then shows ``waiting (REASON)`` instead of ``running``. Read-only; a handful of statements
for all the jobs asked about, none for a finished job.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Engine, and_, func, select
from sqlalchemy.orm import Session, aliased

from .clock import db_now
from .engine import reader
from .models import PAUSED, PENDING, QUEUED, RUNNING, WAITING, Item, LaneControl, PhotoLock, Worker
from .status import JobStatus

JOB_PAUSED = "job paused"
LANE_PAUSED = "lane paused"
NO_WORKER = "no live worker"
PHOTO_LOCKED = "photo locked"
BACKOFF = "backoff"
REASONS = (JOB_PAUSED, LANE_PAUSED, NO_WORKER, PHOTO_LOCKED, BACKOFF)

# A registered worker counts as live while its last beat is within this many beats (at least
# STALE_MIN seconds): the Workers view's rule (``store.listing.workers``).
STALE_BEATS = 3
STALE_MIN = 2.0

HELD = (PENDING, QUEUED)


def live_lanes(s: Session, now: float) -> set[str]:
    """The lanes some live worker serves (registered, not stopped, beating)."""
    out: set[str] = set()
    for lanes, interval, last_beat in s.execute(
        select(Worker.lanes, Worker.interval, Worker.last_beat).where(Worker.stopped_at.is_(None))
    ):
        if now - float(last_beat) <= max(STALE_BEATS * float(interval or 0.0), STALE_MIN):
            out.update(lanes or [])
    return out


def paused_lanes(s: Session) -> dict[str, float]:
    rows = s.execute(
        select(LaneControl.lane, LaneControl.paused_at).where(LaneControl.paused_at.is_not(None))
    ).all()
    return {r.lane: float(r.paused_at) for r in rows}


def _held_counts(st: JobStatus, lane: str) -> int:
    counts = st.lanes.get(lane, {})
    return sum(int(counts.get(x, 0)) for x in HELD)


def waiting(engine: Engine, statuses: Sequence[JobStatus]) -> dict[int, list[dict[str, Any]]]:
    """Per job id of ``statuses``: why its items wait (the entries above), biggest first. A job
    with nothing pending, queued or paused (finished, or all running) gets an empty list."""
    out: dict[int, list[dict[str, Any]]] = {st.job_id: [] for st in statuses}
    active = [
        st
        for st in statuses
        if any(int(c.get(x, 0)) for c in st.lanes.values() for x in (*HELD, PAUSED))
    ]
    if not active:
        return out
    ids = [st.job_id for st in active]
    with Session(reader(engine)) as s:
        now = float(s.execute(select(db_now())).scalar_one())
        paused = paused_lanes(s)
        served = live_lanes(s, now)
        holder = aliased(Item)
        locked = s.execute(
            select(Item.job_id, Item.lane, holder.job_id, func.count(func.distinct(Item.id)))
            .select_from(PhotoLock)
            .join(holder, holder.id == PhotoLock.item_id)
            .join(
                Item,
                and_(
                    Item.photo_id == PhotoLock.photo_id,
                    Item.job_id.in_(ids),
                    Item.state == PENDING,
                    Item.job_id != holder.job_id,
                ),
            )
            .group_by(Item.job_id, Item.lane, holder.job_id)
        ).all()
        backoff = s.execute(
            select(Item.job_id, Item.lane, func.count(), func.max(Item.not_before))
            .where(Item.job_id.in_(ids), Item.state == PENDING, Item.not_before > now)
            .group_by(Item.job_id, Item.lane)
        ).all()
    locks: dict[tuple[int, str], dict[int, int]] = {}
    for job_id, lane, by_job, n in locked:
        locks.setdefault((job_id, lane), {})[int(by_job)] = int(n)
    backs = {(job_id, lane): (int(n), float(until)) for job_id, lane, n, until in backoff}
    for st in active:
        entries = out[st.job_id]
        for lane in st.lane_order or list(st.lanes):
            counts = st.lanes.get(lane, {})
            if int(counts.get(PAUSED, 0)):
                entries.append({"lane": lane, "reason": JOB_PAUSED, "items": int(counts[PAUSED])})
            held = _held_counts(st, lane)
            if not held:
                continue
            if lane in paused:
                entries.append({"lane": lane, "reason": LANE_PAUSED, "items": held, "since": paused[lane]})
                continue
            if lane not in served:
                entries.append({"lane": lane, "reason": NO_WORKER, "items": held, "workers": 0})
                continue
            by_job = locks.get((st.job_id, lane), {})
            if by_job:
                entries.append(
                    {
                        "lane": lane,
                        "reason": PHOTO_LOCKED,
                        "items": sum(by_job.values()),
                        "jobs": sorted(by_job),
                    }
                )
            if (st.job_id, lane) in backs:
                n, until = backs[(st.job_id, lane)]
                n -= sum(by_job.values())  # a deferral behind a lock is named by its lock
                if n > 0:
                    entries.append({"lane": lane, "reason": BACKOFF, "items": n, "until": until})
        entries.sort(key=lambda e: -e["items"])
    return out


def nothing_moves(st: JobStatus, entries: Sequence[Mapping[str, Any]]) -> str | None:
    """The reason to show instead of ``running`` when none of the job's items can move now (none
    running, and every pending or queued item held by a reason), else None."""
    if st.state != "running" or not entries:
        return None
    totals = st.totals()
    if totals.get(RUNNING, 0):
        return None
    held = sum(int(e["items"]) for e in entries if e["reason"] != JOB_PAUSED)
    if held < totals.get(PENDING, 0) + totals.get(QUEUED, 0):
        return None
    if not held and not totals.get(WAITING, 0):
        return None
    return str(max(entries, key=lambda e: e["items"])["reason"])


def explain(engine: Engine, statuses: Sequence[JobStatus]) -> None:
    """Fill each status's ``waiting`` and ``waiting_for`` (in place)."""
    found = waiting(engine, statuses)
    for st in statuses:
        st.waiting = found.get(st.job_id, [])
        st.waiting_for = nothing_moves(st, st.waiting)
