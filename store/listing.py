"""Read views for the web API and the CLI: job and item pages (keyset pagination), failures grouped
by reason class, workers from their registry and leases, and the figures behind ``/metrics``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Select, func, select
from sqlalchemy.orm import Session

from . import counters as store_counters
from . import workers as store_workers
from .clock import db_now
from .engine import reader
from .errors import UnknownJob
from .events import EventRecord, assign_cursors, record_of
from .models import FAILED, PENDING, QUEUED, RUNNING, SKIPPED, TERMINAL, Event, Item, Job, LaneControl, Photo
from .reasons import reason_class
from .status import statuses

MAX_PAGE = 1000
# The states ``derive_job_state`` gives a job.
JOB_STATES = ("running", "pausing", "paused", "cancelling", "cancelled", "succeeded", "failed", "partial")


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
    # Items of later lanes skipped because this group's items failed (folded under their cause):
    # lane -> how many.
    cascade: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "lane": self.lane,
            "state": self.state,
            "reason": self.reason,
            "count": self.count,
            "examples": self.examples,
            "cascade": self.cascade,
            "cascade_total": sum(self.cascade.values()),
        }


def _cause_lane(error: str | None, lanes: Sequence[str]) -> str | None:
    """The earlier lane a skip names as its cause (``"analysis failed: …"``, ``store.finishing.fail``)."""
    head, sep, _ = (error or "").partition(" failed: ")
    return head if sep and head in lanes else None


def failure_groups(
    engine: Engine, job_id: int, *, examples: int = 3, states: Sequence[str] = (FAILED, SKIPPED)
) -> list[FailureGroup]:
    """A job's failed (and skipped) items grouped by (lane, state, reason class), biggest first,
    each with up to ``examples`` items (id, path, the full error). A skip caused by an earlier
    lane's failure of the same photo (``"analysis failed: …"``) is folded under that failure's group
    (its ``cascade``: lane -> skipped items), not listed as a group of its own."""
    groups: dict[tuple[str, str, str], FailureGroup] = {}
    with Session(reader(engine)) as s:
        lanes = list(s.execute(select(Job.lanes).where(Job.id == job_id)).scalar_one_or_none() or [])
        rows = s.execute(
            select(Item.id, Item.lane, Item.state, Item.error, Item.photo_id, Photo.path)
            .outerjoin(Photo, Photo.id == Item.photo_id)
            .where(Item.job_id == job_id, Item.state.in_(tuple(states)))
            .order_by(Item.id)
        ).all()
    key_of: dict[int, tuple[str, str, str]] = {}
    by_photo: dict[tuple[int, str], int] = {}  # (photo, lane) -> item
    for r in rows:
        key_of[r.id] = (r.lane, r.state, reason_class(r.error, [r.path]))
        if r.photo_id is not None:
            by_photo[(r.photo_id, r.lane)] = r.id
    folded: dict[int, tuple[str, str, str]] = {}
    for r in rows:
        cause = _cause_lane(r.error, lanes) if r.state == SKIPPED and r.photo_id is not None else None
        at = by_photo.get((r.photo_id, cause)) if cause is not None and r.photo_id is not None else None
        if at is not None and at != r.id:
            folded[r.id] = at
    for r in rows:
        if r.id in folded:
            continue
        key = key_of[r.id]
        g = groups.setdefault(key, FailureGroup(*key))
        g.count += 1
        if len(g.examples) < examples:
            g.examples.append({"item": r.id, "path": r.path, "error": r.error})
    for r in rows:
        cause_item = folded.get(r.id)
        while cause_item in folded:  # a skip whose cause was itself a skip: the first failure
            cause_item = folded[cause_item]
        if cause_item is None:
            continue
        g = groups[key_of[cause_item]]
        g.cascade[r.lane] = g.cascade.get(r.lane, 0) + 1
    order = {FAILED: 0, SKIPPED: 1}
    return sorted(groups.values(), key=lambda g: (order.get(g.state, 2), -g.count, g.lane, g.reason))


# A registered worker is stale after this many missed beats (but never sooner than STALE_MIN s).
STALE_BEATS = 3
STALE_MIN = 2.0
# Workers fade out of the list (the registry keeps them until the sweeper forgets them): a stopped
# one this long after its clean stop, a stale one this long after its last beat.
FADE_STOPPED = 300.0
FADE_STALE = 900.0


def workers(engine: Engine, *, faded: bool = False) -> list[dict[str, Any]]:
    """Workers: host, pid, lanes, threads, items held (per lane too), what each busy thread runs,
    last heartbeat, ``state``.

    From the registry (``store.workers``, written once per heartbeat, so idle workers show too):
    ``live`` while its last beat is within ``STALE_BEATS`` beats, ``stale`` when its beats
    stopped (killed, frozen, cut off), ``stopped`` after a clean shutdown; a stopped worker is
    left out ``FADE_STOPPED`` seconds after its stop, a stale one ``FADE_STALE`` seconds after
    its last beat (unless ``faded``). The items each holds come from the running leases
    (``lease_owner`` is the worker id). ``running``: each busy thread's item at the worker's last
    beat (``{"thread", "job", "item", "lane", "photo", "path", "since"}``, ``since`` by the
    database clock: its last beat minus the age it reported), of the items it still holds; a
    worker that does not report its threads (an older one) lists each held item, ``since`` its
    claim. A lease owner missing from the registry is listed ``live`` from its leases alone, its
    last heartbeat the freshest renewal (expiry minus TTL). Live first.
    """
    now, registry = store_workers.registered(engine)
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(
                Item.lease_owner,
                Item.lane,
                Item.id,
                Item.job_id,
                Item.photo_id,
                Item.lease_expires_at,
                Item.lease_ttl,
                Item.updated_at,
                Photo.path,
            )
            .outerjoin(Photo, Photo.id == Item.photo_id)
            .where(Item.state == RUNNING, Item.lease_owner.is_not(None))
        ).all()
    by_owner: dict[str, dict[str, Any]] = {}
    reported: dict[str, list[dict[str, Any]] | None] = {}
    for reg in registry:
        stale_after = max(STALE_BEATS * reg.interval, STALE_MIN)
        if reg.stopped_at is not None:
            state = "stopped"
        elif now - reg.last_beat > stale_after:
            state = "stale"
        else:
            state = "live"
        if not faded and (
            (state == "stopped" and now - (reg.stopped_at or now) > FADE_STOPPED)
            or (state == "stale" and now - reg.last_beat > FADE_STALE)
        ):
            continue
        reported[reg.id] = reg.running
        by_owner[reg.id] = {
            "id": reg.id,
            "host": reg.host,
            "pid": reg.pid,
            "lanes": set(reg.lanes),
            "threads": reg.threads,
            "items": [],
            "jobs": set(),
            "last_heartbeat": reg.last_beat,
            "lease_expires_at": None,
            "state": state,
            "registered": True,
            "started_at": reg.started_at,
            "stopped_at": reg.stopped_at,
            "heartbeat_interval": reg.interval,
            "items_held": reg.items_held,
        }
    held: dict[str, dict[int, Any]] = {}
    for r in rows:
        host, pid = store_workers.parse_identity(r.lease_owner or "")
        w = by_owner.get(r.lease_owner)
        if w is None:
            if r.lease_owner in {reg.id for reg in registry}:
                continue  # a faded worker's leftover lease: the sweeper takes it back
            w = by_owner[r.lease_owner] = {
                "id": r.lease_owner,
                "host": host,
                "pid": pid,
                "lanes": set(),
                "threads": None,
                "items": [],
                "jobs": set(),
                "last_heartbeat": None,
                "lease_expires_at": None,
                "state": "live",
                "registered": False,
                "started_at": None,
                "stopped_at": None,
                "heartbeat_interval": None,
                "items_held": None,
            }
            reported[r.lease_owner] = None
        if not w["registered"]:
            w["lanes"].add(r.lane)
        w["items"].append(r.id)
        w["jobs"].add(r.job_id)
        held.setdefault(r.lease_owner, {})[r.id] = r
        if r.lease_expires_at is not None:
            if not w["registered"]:
                beat = r.lease_expires_at - (r.lease_ttl or 0.0)
                w["last_heartbeat"] = max(w["last_heartbeat"] or beat, beat)
            w["lease_expires_at"] = max(w["lease_expires_at"] or r.lease_expires_at, r.lease_expires_at)
    order = {"live": 0, "stale": 1, "stopped": 2}
    out = []
    for w in sorted(
        by_owner.values(), key=lambda w: (order.get(w["state"], 3), w["host"], w["pid"] or 0, w["id"])
    ):
        mine = held.get(w["id"], {})
        by_lane: dict[str, int] = {}
        for r in mine.values():
            by_lane[r.lane] = by_lane.get(r.lane, 0) + 1
        out.append(
            {
                **w,
                "lanes": sorted(w["lanes"]),
                "jobs": sorted(w["jobs"]),
                "items": sorted(w["items"]),
                "held": len(w["items"]),
                "held_by_lane": by_lane,
                "running": _running(w, reported.get(w["id"]), mine),
                "heartbeat_age": None if w["last_heartbeat"] is None else max(0.0, now - w["last_heartbeat"]),
                "now": now,
            }
        )
    return out


def _running(
    w: dict[str, Any], reported: list[dict[str, Any]] | None, held: dict[int, Any]
) -> list[dict[str, Any]]:
    """What each busy thread of worker ``w`` runs (see ``workers``)."""

    def entry(r: Any, since: float, thread: str | None) -> dict[str, Any]:
        return {
            "thread": thread,
            "job": r.job_id,
            "item": r.id,
            "lane": r.lane,
            "photo": r.photo_id,
            "path": r.path,
            "since": since,
        }

    if w["state"] == "stopped":
        return []
    if reported is None:
        return [entry(r, float(r.updated_at), None) for _, r in sorted(held.items())]
    named = {t.get("item") for t in reported if isinstance(t, dict)}
    # Items it holds that no thread named at its last beat, newest claim first: a thread whose
    # named item has finished since is on one of these now (its next claim, or its batch's next).
    others = sorted(
        (r for i, r in held.items() if i not in named), key=lambda r: (-float(r.updated_at), r.id)
    )
    out = []
    for t in reported:
        item = t.get("item") if isinstance(t, dict) else None
        r = held.get(item) if isinstance(item, int) else None
        thread = str(t.get("thread") or "") if isinstance(t, dict) else ""
        if r is None:
            if others:  # finished since the beat: the thread has moved on to a newer one
                nxt = others.pop(0)
                out.append(entry(nxt, float(nxt.updated_at), thread))
            continue
        age = t.get("age")
        since = w["last_heartbeat"] - float(age) if isinstance(age, int | float) else float(r.updated_at)
        out.append(entry(r, since, thread))
    return out


THROUGHPUT_WINDOW = 60.0
RECENT_EVENTS = 20000
# The item states a lane's queue depth is reported in (``photojobs_lane_items``).
DEPTH_STATES = (PENDING, QUEUED, RUNNING)
WORKER_STATES = ("live", "stale", "stopped")


@dataclass
class MetricsSnapshot:
    items: dict[tuple[str, str], int]  # (lane, state) -> n, over every job in the store
    counters: store_counters.Counters  # events folded so far by (type, lane): never go back
    throughput: dict[str, float]  # lane -> items finished per second over the last minute
    jobs: dict[str, int]  # job state -> n
    depth: dict[tuple[str, str], int] = field(default_factory=dict)  # (lane, DEPTH_STATES) -> n
    oldest_queued_age: dict[str, float] = field(default_factory=dict)  # lane -> s (0: none queued)
    workers: dict[str, int] = field(default_factory=dict)  # WORKER_STATES -> n
    lane_workers: dict[str, int] = field(default_factory=dict)  # lane -> live workers serving it
    oldest_pending_age: dict[str, float] = field(default_factory=dict)  # lane -> s (0: none ready)
    paused: dict[str, float] = field(default_factory=dict)  # lane -> 1 paused, 0 not


def depth_query(lane: str) -> Select[tuple[str, int]]:
    """A lane's items by state among ``DEPTH_STATES``: a search of ``ix_items_dispatch``."""
    return (
        select(Item.state, func.count())
        .where(Item.lane == lane, Item.state.in_(DEPTH_STATES))
        .group_by(Item.state)
    )


def oldest_queued_query(lane: str) -> Select[tuple[float | None]]:
    """When the lane's oldest queued item was queued: a search of ``ix_items_dispatch`` over its
    queued items (at most the lane's bound of messages times its batch)."""
    return select(func.min(Item.queued_at)).where(Item.lane == lane, Item.state == QUEUED)


def oldest_ready_queries(lane: str) -> tuple[Select[Any], Select[Any]]:
    """When the lane's longest-waiting ready item became ready (pending or queued: ``updated_at``,
    which queuing and deferrals leave as it was): its first pending item in
    dispatch order — one row of ``ix_items_dispatch`` (lane, state, job_id, id), however many are
    held back by a pause — and the oldest of its queued items (at most its bound)."""
    first_pending = (
        select(Item.updated_at, Item.not_before)
        .where(Item.lane == lane, Item.state == PENDING)
        .order_by(Item.job_id, Item.id)
        .limit(1)
    )
    oldest_queued = select(func.min(Item.updated_at)).where(Item.lane == lane, Item.state == QUEUED)
    return first_pending, oldest_queued


def metrics(engine: Engine, lanes: Sequence[str] = ()) -> MetricsSnapshot:
    """The figures behind ``/metrics``: the event log folded into the counters first (so they include
    every event numbered so far, ``store.counters``), one grouped count of items, the depth and oldest
    queued age of each of ``lanes``, the workers by state, and the throughput over the last minute
    from the newest events (read by cursor, no time index needed)."""
    store_counters.fold(engine)
    counters = store_counters.read(engine)
    with Session(reader(engine)) as s:
        now = s.execute(select(db_now())).scalar_one()
        items = {
            (lane, state): n
            for lane, state, n in s.execute(
                select(Item.lane, Item.state, func.count()).group_by(Item.lane, Item.state)
            )
        }
        depth: dict[tuple[str, str], int] = {}
        oldest: dict[str, float] = {}
        ready_age: dict[str, float] = {}
        for lane in lanes:
            counts: dict[str, int] = {st: n for st, n in s.execute(depth_query(lane))}
            for state in DEPTH_STATES:
                depth[(lane, state)] = int(counts.get(state, 0))
            first = s.execute(oldest_queued_query(lane)).scalar_one()
            oldest[lane] = 0.0 if first is None else max(0.0, now - first)
            pending_q, queued_q = oldest_ready_queries(lane)
            since = [r for r in s.execute(queued_q).scalars() if r is not None]
            row = s.execute(pending_q).first()
            if row is not None:
                since.append(row.updated_at)
            ready_age[lane] = max(0.0, now - min(since)) if since else 0.0
        paused = {
            lane: 1.0 if at is not None else 0.0
            for lane, at in s.execute(select(LaneControl.lane, LaneControl.paused_at))
        }
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
    fleet = workers(engine, faded=True)  # every registered worker, until the sweeper forgets it
    by_state = dict.fromkeys(WORKER_STATES, 0)
    lane_workers = dict.fromkeys(lanes, 0)
    for w in fleet:
        by_state[w["state"]] = by_state.get(w["state"], 0) + 1
        if w["state"] == "live":
            for lane in w["lanes"]:
                lane_workers[lane] = lane_workers.get(lane, 0) + 1
    return MetricsSnapshot(
        items=items,
        counters=counters,
        throughput=throughput,
        jobs=jobs,
        depth=depth,
        oldest_queued_age=oldest,
        workers=by_state,
        lane_workers=lane_workers,
        oldest_pending_age=ready_age,
        paused={lane: paused.get(lane, 0.0) for lane in lanes} | paused,
    )


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
        return [st.state for st in statuses(s, jobs)]


def latest_events(engine: Engine, *, job_id: int | None = None, limit: int = 50) -> list[EventRecord]:
    """The newest ``limit`` numbered events (of a job), in cursor order (a dashboard's feed)."""
    assign_cursors(engine)
    q = select(Event).where(Event.seq.is_not(None)).order_by(Event.seq.desc()).limit(limit)
    if job_id is not None:
        q = q.where(Event.job_id == job_id)
    with Session(reader(engine)) as s:
        rows = list(s.execute(q).scalars())
    return [record_of(e) for e in reversed(rows)]
