"""Read views for the web API and the CLI: job and item pages (keyset pagination), failures grouped
by reason class, live workers from their leases, and the figures behind ``/metrics``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import UnknownJob
from .events import EventRecord, assign_cursors
from .jobs import JobStatus, derive_job_state
from .models import FAILED, RUNNING, SKIPPED, TERMINAL, Event, Item, Job, Photo
from .reasons import reason_class

MAX_PAGE = 1000
# The states ``derive_job_state`` gives a job.
JOB_STATES = ("running", "pausing", "paused", "cancelling", "cancelled", "succeeded", "failed", "partial")


def _statuses(s: Session, jobs: Sequence[Job]) -> list[JobStatus]:
    ids = [j.id for j in jobs]
    counts: dict[int, dict[str, dict[str, int]]] = {i: {} for i in ids}
    if ids:
        for job_id, lane, state, n in s.execute(
            select(Item.job_id, Item.lane, Item.state, func.count())
            .where(Item.job_id.in_(ids))
            .group_by(Item.job_id, Item.lane, Item.state)
        ):
            counts[job_id].setdefault(lane, {})[state] = n
    out = []
    for job in jobs:
        lanes: dict[str, dict[str, int]] = {name: {} for name in job.lanes}
        for lane, by_state in counts[job.id].items():
            lanes.setdefault(lane, {}).update(by_state)
        st = JobStatus(
            job_id=job.id,
            state="",
            control=job.control,
            lanes=lanes,
            lane_order=list(job.lanes),
            params=dict(job.params or {}),
            created_at=job.created_at,
        )
        st.state = derive_job_state(job.control, st.totals())
        out.append(st)
    return out


def list_jobs(
    engine: Engine, *, state: str | None = None, limit: int = 20, after: int | None = None
) -> tuple[list[JobStatus], int | None]:
    """Jobs newest first, ``limit`` a page; ``after`` is the previous page's ``next`` (a job id).

    Returns the page and the cursor of the next page (None at the end). A ``state`` filter is
    applied to the derived job state, scanning further pages as needed.
    """
    limit = max(1, min(limit, MAX_PAGE))
    found: list[JobStatus] = []
    cursor = after
    with Session(reader(engine)) as s:
        while True:
            q = select(Job).order_by(Job.id.desc()).limit(limit)
            if cursor is not None:
                q = q.where(Job.id < cursor)
            jobs = list(s.execute(q).scalars())
            if not jobs:
                return found, None
            for st in _statuses(s, jobs):
                cursor = st.job_id
                if state is None or st.state == state:
                    found.append(st)
                    if len(found) == limit:
                        more = s.execute(select(Job.id).where(Job.id < st.job_id).limit(1)).first()
                        return found, (st.job_id if more else None)
            if len(jobs) < limit:
                return found, None


@dataclass(frozen=True)
class ItemRow:
    id: int
    job: int
    lane: str
    state: str
    photo: int | None
    path: str | None
    attempt: int
    token: int
    error: str | None
    reason: str | None
    lease_owner: str | None
    updated_at: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "job": self.job,
            "lane": self.lane,
            "state": self.state,
            "photo": self.photo,
            "path": self.path,
            "attempt": self.attempt,
            "token": self.token,
            "error": self.error,
            "reason": self.reason,
            "worker": self.lease_owner,
            "updated_at": self.updated_at,
        }


def list_items(
    engine: Engine,
    job_id: int,
    *,
    state: str | None = None,
    lane: str | None = None,
    limit: int = 100,
    after: int | None = None,
) -> tuple[list[ItemRow], int | None]:
    """A job's items in id order, filtered by state and lane; ``after`` is the previous ``next``."""
    limit = max(1, min(limit, MAX_PAGE))
    with Session(reader(engine)) as s:
        if s.get(Job, job_id) is None:
            raise UnknownJob(job_id)
        q = (
            select(Item, Photo.path)
            .outerjoin(Photo, Photo.id == Item.photo_id)
            .where(Item.job_id == job_id)
            .order_by(Item.id)
            .limit(limit + 1)
        )
        if state:
            q = q.where(Item.state == state)
        if lane:
            q = q.where(Item.lane == lane)
        if after is not None:
            q = q.where(Item.id > after)
        rows = s.execute(q).all()
    more = len(rows) > limit
    out = [
        ItemRow(
            id=i.id,
            job=i.job_id,
            lane=i.lane,
            state=i.state,
            photo=i.photo_id,
            path=path,
            attempt=i.attempt,
            token=i.fencing_token,
            error=i.error,
            reason=reason_class(i.error, [path]) if i.error else None,
            lease_owner=i.lease_owner,
            updated_at=i.updated_at,
        )
        for i, path in rows[:limit]
    ]
    return out, (out[-1].id if more and out else None)


@dataclass
class FailureGroup:
    lane: str
    state: str
    reason: str
    count: int = 0
    examples: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "state": self.state,
            "reason": self.reason,
            "count": self.count,
            "examples": self.examples,
        }


def failure_groups(
    engine: Engine, job_id: int, *, examples: int = 3, states: Sequence[str] = (FAILED, SKIPPED)
) -> list[FailureGroup]:
    """A job's failed (and skipped) items grouped by (lane, state, reason class), biggest first,
    each with up to ``examples`` items (id, path, the full error)."""
    groups: dict[tuple[str, str, str], FailureGroup] = {}
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.id, Item.lane, Item.state, Item.error, Photo.path)
            .outerjoin(Photo, Photo.id == Item.photo_id)
            .where(Item.job_id == job_id, Item.state.in_(tuple(states)))
            .order_by(Item.id)
        ).all()
    for r in rows:
        reason = reason_class(r.error, [r.path])
        g = groups.setdefault((r.lane, r.state, reason), FailureGroup(r.lane, r.state, reason))
        g.count += 1
        if len(g.examples) < examples:
            g.examples.append({"item": r.id, "path": r.path, "error": r.error})
    order = {FAILED: 0, SKIPPED: 1}
    return sorted(groups.values(), key=lambda g: (order.get(g.state, 2), -g.count, g.lane, g.reason))


def workers(engine: Engine) -> list[dict[str, Any]]:
    """Live workers, as their leases show them: host, pid, lanes, items held, last heartbeat.

    A worker is live while it holds a running lease (``lease_owner`` is ``host:pid:nonce``); its
    last heartbeat is when its freshest lease was last renewed (expiry minus TTL).
    """
    with Session(reader(engine)) as s:
        now = s.execute(select(db_now())).scalar_one()
        rows = s.execute(
            select(
                Item.lease_owner,
                Item.lane,
                Item.id,
                Item.job_id,
                Item.lease_expires_at,
                Item.lease_ttl,
            ).where(Item.state == RUNNING, Item.lease_owner.is_not(None))
        ).all()
    by_owner: dict[str, dict[str, Any]] = {}
    for r in rows:
        host, _, rest = (r.lease_owner or "").partition(":")
        pid_text = rest.split(":", 1)[0]
        w = by_owner.setdefault(
            r.lease_owner,
            {
                "id": r.lease_owner,
                "host": host,
                "pid": int(pid_text) if pid_text.isdigit() else None,
                "lanes": set(),
                "items": [],
                "jobs": set(),
                "last_heartbeat": None,
                "lease_expires_at": None,
            },
        )
        w["lanes"].add(r.lane)
        w["items"].append(r.id)
        w["jobs"].add(r.job_id)
        if r.lease_expires_at is not None:
            beat = r.lease_expires_at - (r.lease_ttl or 0.0)
            w["last_heartbeat"] = max(w["last_heartbeat"] or beat, beat)
            w["lease_expires_at"] = max(w["lease_expires_at"] or r.lease_expires_at, r.lease_expires_at)
    out = []
    for w in sorted(by_owner.values(), key=lambda w: (w["host"], w["pid"] or 0, w["id"])):
        out.append(
            {
                **w,
                "lanes": sorted(w["lanes"]),
                "jobs": sorted(w["jobs"]),
                "items": sorted(w["items"]),
                "held": len(w["items"]),
                "heartbeat_age": None if w["last_heartbeat"] is None else max(0.0, now - w["last_heartbeat"]),
                "now": now,
            }
        )
    return out


COUNTED_EVENTS = (
    "lease_expired",
    "stale_commit_rejected",
    "item_succeeded",
    "item_failed",
    "message_rejected",
)
THROUGHPUT_WINDOW = 60.0
RECENT_EVENTS = 20000


@dataclass
class MetricsSnapshot:
    items: dict[tuple[str, str], int]  # (lane, state) -> n, over every job in the store
    events: dict[str, int]  # counted event type -> n (since the last prune)
    throughput: dict[str, float]  # lane -> items finished per second over the last minute
    jobs: dict[str, int]  # job state -> n


def metrics(engine: Engine) -> MetricsSnapshot:
    """The figures behind ``/metrics``: one grouped count of items, one of counted events, and the
    throughput over the last minute from the newest events (read by cursor, no time index needed)."""
    with Session(reader(engine)) as s:
        now = s.execute(select(db_now())).scalar_one()
        items = {
            (lane, state): n
            for lane, state, n in s.execute(
                select(Item.lane, Item.state, func.count()).group_by(Item.lane, Item.state)
            )
        }
        events = {t: 0 for t in COUNTED_EVENTS} | dict(
            s.execute(
                select(Event.type, func.count()).where(Event.type.in_(COUNTED_EVENTS)).group_by(Event.type)
            ).all()
        )
        recent = (
            select(Event.lane, Event.type, Event.at)
            .where(Event.seq.is_not(None))
            .order_by(Event.seq.desc())
            .limit(RECENT_EVENTS)
            .subquery()
        )
        finished = s.execute(
            select(recent.c.lane, func.count())
            .where(
                recent.c.type.in_(("item_succeeded", "item_failed")),
                recent.c.at >= now - THROUGHPUT_WINDOW,
            )
            .group_by(recent.c.lane)
        ).all()
    throughput = {lane: n / THROUGHPUT_WINDOW for lane, n in finished if lane}
    jobs: dict[str, int] = {}
    for st in _job_states(engine):
        jobs[st] = jobs.get(st, 0) + 1
    return MetricsSnapshot(items=items, events=events, throughput=throughput, jobs=jobs)


def _job_states(engine: Engine) -> list[str]:
    """The derived state of every job that still has unfinished items (finished ones are cheap to
    skip: they are counted by their items)."""
    with Session(reader(engine)) as s:
        active_ids = (
            s.execute(select(Item.job_id).where(Item.state.not_in(tuple(TERMINAL))).group_by(Item.job_id))
            .scalars()
            .all()
        )
        if not active_ids:
            return []
        jobs = list(s.execute(select(Job).where(Job.id.in_(active_ids))).scalars())
        return [st.state for st in _statuses(s, jobs)]


def latest_events(engine: Engine, *, job_id: int | None = None, limit: int = 50) -> list[EventRecord]:
    """The newest ``limit`` numbered events (of a job), in cursor order (a dashboard's feed)."""
    assign_cursors(engine)
    q = select(Event).where(Event.seq.is_not(None)).order_by(Event.seq.desc()).limit(limit)
    if job_id is not None:
        q = q.where(Event.job_id == job_id)
    with Session(reader(engine)) as s:
        rows = list(s.execute(q).scalars())
    return [
        EventRecord(
            cursor=int(e.seq or 0),
            job=e.job_id,
            item=e.item_id,
            photo=e.photo_id,
            lane=e.lane,
            type=e.type,
            attempt=e.attempt,
            token=e.token,
            worker=e.worker,
            at=e.at,
            detail=e.detail,
        )
        for e in reversed(rows)
    ]
