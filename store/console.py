"""The operator console's reads and narrow controls: jobs found by state (through an index) and by
text, a job's times and ETA (``store.eta``: from the work it has left), lane depth and
throughput, the retry or discard of chosen failures, an item's attempts, the filtered event feed
and the jobs a bulk action acts on.

A job's state is derived from its items (``store.jobs.derive_job_state``, the one place that decides
it). The state filter does not recompute it for every job: for each state it asks the database for
the jobs that *can* be in it — job ids from index ranges on items (``_has``) — and confirms each
candidate with the derived state.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Engine,
    Integer,
    String,
    and_,
    case,
    cast,
    exists,
    func,
    not_,
    or_,
    select,
    text,
    update,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.functions import FunctionElement

from photos.params import ALLOWED_ROOTS_KEY, SKIPPED_KEY

from .clock import db_now
from .engine import reader
from .errors import NotApplicable, SearchBusy, SearchTooCostly, UnknownJob
from .eta import job_eta
from .events import EventRecord, assign_cursors, emit_many, record_of
from .lanes import LANE_NAMES, LaneSpec, all_lanes
from .listing import MAX_PAGE
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
    Event,
    Item,
    Job,
    Photo,
)
from .queries import job_for_change
from .reasons import reason_class
from .status import JobStatus, statuses

MAX_ROW_ID = 2**31 - 1
#: A search's cost bound: each statement stops after this many seconds (PostgreSQL's
#: ``statement_timeout``, SQLite's progress handler), and at most SEARCH_SLOTS run at once in a
#: process (a search waits at most its time bound for a slot), so the plain list stays fast.
SEARCH_TIMEOUT = 3.0
SEARCH_SLOTS = 2
#: A photo-path search needs at least this many characters (what a trigram index can serve).
MIN_PATH_SEARCH = 3
_search_slots = threading.BoundedSemaphore(SEARCH_SLOTS)
ACTIVE = (WAITING, PENDING, QUEUED, RUNNING)
# The states of ``ix_items_settled_job`` (migration 0010): rare, and never on the hot path (an item
# that runs and succeeds never enters the index, so it costs the claim and the finish nothing).
SETTLED_INDEXED = (FAILED, SKIPPED, CANCELLED, PAUSED)
SETTLED_PREDICATE = "items.state IN ('failed', 'skipped', 'cancelled', 'paused')"
# What the console filters by: the states ``derive_job_state`` gives a job.
CONSOLE_JOB_STATES = (
    "submitting",
    "running",
    "pausing",
    "paused",
    "cancelling",
    "cancelled",
    "succeeded",
    "failed",
    "partial",
)
DEPTH_STATES = (WAITING, PENDING, QUEUED, RUNNING, PAUSED)
FINISH_EVENTS = ("item_succeeded", "item_failed")
# Throughput is read from the newest events only (by primary key, no time index needed).
RECENT_EVENTS = 200_000
ETA_WINDOW = 600.0  # a lane's rate: items finished over its busy time within the last 10 minutes
DISCARDED = "item_discarded"


def _has(states: Sequence[str]) -> ColumnElement[bool]:
    """The job has an item in one of ``states``. Job ids come from index ranges, no item row read:
    a settled state from the partial index ``ix_items_settled_job`` (its predicate is repeated
    word for word, so SQLite uses it too), an active one from ``ix_items_dispatch`` (lane, state,
    job_id) over every lane."""
    settled = [s for s in states if s in SETTLED_INDEXED]
    active = [s for s in states if s not in SETTLED_INDEXED]
    conds: list[ColumnElement[bool]] = []
    if settled:
        sub = select(Item.job_id).where(text(SETTLED_PREDICATE), Item.state.in_(settled))
        conds.append(Job.id.in_(sub))
    if active:
        sub = select(Item.job_id).where(Item.lane.in_(LANE_NAMES), Item.state.in_(active))
        conds.append(Job.id.in_(sub))
    return or_(*conds)


def state_hint(state: str) -> ColumnElement[bool]:
    """A necessary condition, in SQL, for a job to be in ``state``: every job in it matches (the
    derived state then decides). Follows ``derive_job_state`` branch by branch."""
    not_cancel = or_(Job.control.is_(None), Job.control != CANCEL)
    hints: dict[str, ColumnElement[bool]] = {
        "submitting": and_(Job.submitting.is_(True), not_cancel),
        "pausing": and_(Job.control == PAUSE, _has([RUNNING])),
        "paused": or_(Job.control == PAUSE, _has([PAUSED])),
        "running": _has(ACTIVE),
        "cancelling": and_(Job.control == CANCEL, _has(ACTIVE)),
        "cancelled": or_(Job.control == CANCEL, _has([CANCELLED])),
        "succeeded": not_(_has([s for s in ALL_STATES if s != SUCCEEDED])),
        "failed": _has([FAILED, SKIPPED]),
        "partial": _has([FAILED, SKIPPED]),
    }
    if state not in hints:
        raise ValueError(f"unknown job state {state!r}; states: {', '.join(CONSOLE_JOB_STATES)}")
    return hints[state]


def _like(text: str) -> str:
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


# What the server adds to a job's parameters (the roots it confined the job to, what the folder scan
# left out): recorded with the job, but not what the job was given, so not what a search matches (a
# root's folder name matched every job the server confined to it).
ADDED_PARAMS = (ALLOWED_ROOTS_KEY, SKIPPED_KEY)


class GivenParams(FunctionElement[str]):
    """A job's parameters as text without :data:`ADDED_PARAMS` (``jsonb - key`` on PostgreSQL,
    ``json_remove`` on SQLite)."""

    type = String()
    name = "given_params"
    inherit_cache = True


@compiles(GivenParams, "postgresql")
def _given_params_pg(element: GivenParams, compiler: Any, **kw: Any) -> str:
    keys = "".join(f" - '{k}'" for k in ADDED_PARAMS)
    return f"(CAST({compiler.process(element.clauses, **kw)} AS jsonb){keys})::text"


@compiles(GivenParams)
def _given_params_sqlite(element: GivenParams, compiler: Any, **kw: Any) -> str:
    paths = ", ".join(f"'$.\"{k}\"'" for k in ADDED_PARAMS)
    return f"json_remove({compiler.process(element.clauses, **kw)}, {paths})"


def search_hint(query: str) -> ColumnElement[bool]:
    """Jobs matching ``query``: its id (``17`` or ``#17``), a lane, a parameter it was given
    (``key``, ``value`` or ``key=value``; not those the server added, :data:`ADDED_PARAMS`) or a
    photo path containing it (case-insensitive; ``MIN_PATH_SEARCH`` characters at least)."""
    given = GivenParams(Job.params)
    text = query.strip()
    conds: list[ColumnElement[bool]] = []
    bare = text.lstrip("#")
    if bare.isascii() and bare.isdigit() and int(bare) <= MAX_ROW_ID:
        conds.append(Job.id == int(bare))
    pattern = _like(text)
    conds.append(cast(Job.lanes, String).ilike(pattern, escape="\\"))
    if "=" in text:
        key, _, value = text.partition("=")
        conds.append(
            and_(
                given.ilike(_like(key.strip()), escape="\\"),
                given.ilike(_like(value.strip()), escape="\\"),
            )
        )
    else:
        conds.append(given.ilike(pattern, escape="\\"))
    if len(text) >= MIN_PATH_SEARCH:  # PostgreSQL: ix_photos_path_trgm (revision 0012) serves it
        conds.append(
            exists().where(
                Item.job_id == Job.id,
                Item.photo_id == Photo.id,
                Photo.path.ilike(pattern, escape="\\"),
            )
        )
    return or_(*conds)


# The jobs list shows the jobs that are moving first (an item waiting, pending, queued or running,
# or still being submitted), newest first, then the others, newest first. Its cursor stays one
# integer: a job id for the second part, MOVING + a job id for the first (MOVING alone: the second
# part from its newest job). Every job is reached once while none changes part between pages.
MOVING = MAX_ROW_ID + 1


def moving_hint() -> ColumnElement[bool]:
    """A job with an item waiting, pending, queued or running, or still being submitted."""
    return or_(_has(ACTIVE), Job.submitting.is_(True))


def find_jobs(
    engine: Engine,
    *,
    state: str | None = None,
    query: str | None = None,
    limit: int = 20,
    after: int | None = None,
    timeout: float = SEARCH_TIMEOUT,
) -> tuple[list[JobStatus], int | None]:
    """Jobs filtered by derived ``state`` and a search ``query``, ``limit`` a page: newest first
    with a state, else the moving ones first (:data:`MOVING`), each part newest first. ``after`` is
    the previous page's ``next``. Returns the page and the next cursor (None at the end): every job
    is reachable by following it. A search is bounded: each of its statements stops after
    ``timeout`` seconds (:class:`SearchTooCostly`), and it waits at most that long for one of the
    process's ``SEARCH_SLOTS`` (:class:`SearchBusy`)."""
    limit = max(1, min(limit, MAX_PAGE))
    conds: list[ColumnElement[bool]] = []
    if state:
        conds.append(state_hint(state))
    if query and query.strip():
        conds.append(search_hint(query))
    searching = bool(query and query.strip())
    # (cursor offset, conditions, job id to start below) of each part still to list
    moving = moving_hint()
    first, rest = (MOVING, [*conds, moving]), (0, [*conds, not_(moving)])
    if state:  # one part: the state says which
        parts = [(0, conds, after)]
    elif after is None:
        parts = [(*first, None), (*rest, None)]
    elif after < MOVING:  # a job id: within the second part
        parts = [(*rest, after)]
    elif after == MOVING:  # the second part from its newest job
        parts = [(*rest, None)]
    else:
        parts = [(*first, after - MOVING), (*rest, None)]
    found: list[JobStatus] = []
    with _bounded(engine, timeout if searching else None) as s:
        for n, (offset, where, cursor) in enumerate(parts):
            page, nxt = _page(s, where, state, limit - len(found), cursor)
            found += page
            if nxt is not None:
                return found, offset + nxt
            if len(found) == limit:  # the part ended with the page: does a later one hold a job?
                later = parts[n + 1 :]
                more = any(s.execute(select(Job.id).where(*w).limit(1)).first() for _o, w, _c in later)
                return found, MOVING if more else None
    return found, None


def _page(
    s: Session, conds: list[ColumnElement[bool]], state: str | None, limit: int, cursor: int | None
) -> tuple[list[JobStatus], int | None]:
    """Up to ``limit`` jobs matching ``conds`` (and ``state``, derived) below job id ``cursor``,
    newest first, and the id to go on from (None when none is left)."""
    found: list[JobStatus] = []
    while True:
        q = select(Job).where(*conds).order_by(Job.id.desc()).limit(limit)
        if cursor is not None:
            q = q.where(Job.id < cursor)
        jobs = list(s.execute(q).scalars())
        if not jobs:
            return found, None
        for st in statuses(s, jobs):
            cursor = st.job_id
            if state is None or st.state == state:
                found.append(st)
                if len(found) == limit:
                    more = s.execute(select(Job.id).where(*conds, Job.id < st.job_id).limit(1)).first()
                    return found, (st.job_id if more else None)
        if len(jobs) < limit:
            return found, None


@contextmanager
def _bounded(engine: Engine, timeout: float | None) -> Iterator[Session]:
    """A read session; with ``timeout``, a search slot and a time bound on every statement."""
    if timeout is None:
        with Session(reader(engine)) as s:
            yield s
        return
    if not _search_slots.acquire(timeout=timeout):
        raise SearchBusy(SEARCH_SLOTS)
    try:
        with Session(reader(engine)) as s:
            if engine.dialect.name == "postgresql":
                s.execute(text(f"SET LOCAL statement_timeout = {max(1, int(timeout * 1000))}"))
                try:
                    yield s
                except DBAPIError as exc:
                    if getattr(exc.orig, "sqlstate", None) == "57014":  # query_canceled
                        raise SearchTooCostly(timeout) from None
                    raise
                return
            raw = s.connection().connection.driver_connection
            deadline = time.monotonic() + timeout
            raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 100_000)
            try:
                yield s
            except DBAPIError as exc:
                if "interrupted" in str(exc.orig):
                    raise SearchTooCostly(timeout) from None
                raise
            finally:
                raw.set_progress_handler(None, 0)
    finally:
        _search_slots.release()


def job_ids_query(state: str | None, query: str | None) -> Any:
    """The candidate query ``find_jobs`` pages through (for EXPLAIN in tests and benchmarks)."""
    conds = [state_hint(state)] if state else []
    if query:
        conds.append(search_hint(query))
    return select(Job.id).where(*conds).order_by(Job.id.desc()).limit(20)


# -- a job's times -------------------------------------------------------------------------------
@dataclass(frozen=True)
class JobTimes:
    created_at: float
    started_at: float | None  # its first claim (from the event log; None before, or once pruned)
    finished_at: float | None  # its last item's finish, once nothing is left to run
    now: float
    eta: float | None  # seconds until its remaining work is done (``store.eta``; None: measuring)
    rates: dict[str, float] = field(default_factory=dict)  # lane -> items/s the fleet gives it
    work: dict[str, dict[str, Any]] = field(default_factory=dict)  # lane -> remaining, per_item, concurrency

    def as_dict(self) -> dict[str, Any]:
        end = self.finished_at if self.finished_at is not None else self.now
        return {
            "created_at": self.created_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "now": self.now,
            "waited": None if self.started_at is None else max(0.0, self.started_at - self.created_at),
            "ran": None if self.started_at is None else max(0.0, end - self.started_at),
            "took": None if self.finished_at is None else max(0.0, self.finished_at - self.created_at),
            "eta": self.eta,
            "rates": self.rates,
            "work": self.work,
        }


def job_times(engine: Engine, status: JobStatus, specs: Mapping[str, LaneSpec] | None = None) -> JobTimes:
    """Created, started (first claim), finished (last item, when none is left to run) and the ETA
    from the work left (``store.eta.job_eta``: per lane, remaining × busy time per item ÷ the
    threads the live fleet gives it, along the pipeline's dependencies) for the job of ``status``."""
    job_id = status.job_id
    remaining = {
        lane: sum(n for st, n in counts.items() if st in DEPTH_STATES)
        for lane, counts in status.lanes.items()
    }
    with Session(reader(engine)) as s:
        now = float(s.execute(select(db_now())).scalar_one())
        started = s.execute(
            select(func.min(Event.at)).where(Event.job_id == job_id, Event.type == "item_claimed")
        ).scalar_one_or_none()
        finished = None
        if not any(remaining.values()) and status.state not in ("submitting",):
            finished = s.execute(select(func.max(Item.updated_at)).where(Item.job_id == job_id)).scalar()
    eta: float | None = None
    rates: dict[str, float] = {}
    work: dict[str, dict[str, Any]] = {}
    if any(remaining.values()):
        total = sum(sum(counts.values()) for counts in status.lanes.values())
        order = list(status.lane_order) or list(status.lanes)
        eta, parts = job_eta(
            engine,
            job_id,
            remaining,
            order,
            specs or all_lanes({}),
            settled=total - sum(remaining.values()),
            total=total,
            now=now,
            held={lane: counts.get(RUNNING, 0) for lane, counts in status.lanes.items()},
        )
        for lane, lw in parts.items():
            work[lane] = {
                "remaining": lw.remaining,
                "per_item": None if lw.per_item is None else round(lw.per_item, 4),
                "concurrency": lw.concurrency,
            }
            if lw.per_item and lw.concurrency:
                rates[lane] = round(lw.concurrency / lw.per_item, 4)
    return JobTimes(
        created_at=status.created_at,
        started_at=None if started is None else float(started),
        finished_at=None if finished is None else float(finished),
        now=now,
        eta=None if eta is None else round(eta, 3),
        rates=rates,
        work=work,
    )


# -- lanes -------------------------------------------------------------------------------------------
def lane_depths(engine: Engine) -> dict[str, dict[str, int]]:
    """Items not finished, per lane and state (waiting, pending, queued, running, paused)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.lane, Item.state, func.count())
            .where(Item.state.in_(DEPTH_STATES))
            .group_by(Item.lane, Item.state)
        ).all()
    out: dict[str, dict[str, int]] = {}
    for lane, state, n in rows:
        out.setdefault(lane, {})[state] = int(n)
    return out


def _bucket_expr(engine: Engine, start: float, bucket: float) -> ColumnElement[int]:
    offset = (Event.at - start) / bucket
    if engine.dialect.name == "postgresql":
        return cast(func.floor(offset), Integer)
    return cast(offset, Integer)  # SQLite truncates toward zero; offset is never negative here


def lane_throughput(
    engine: Engine, *, window: float = 3600.0, bucket: float = 60.0, lanes: Collection[str] | None = None
) -> tuple[float, dict[str, list[int]]]:
    """Items finished (succeeded or failed) per lane in each ``bucket`` of the last ``window``
    seconds, oldest bucket first, from the event log (its newest ``RECENT_EVENTS`` rows). Returns
    the window's start (database time) and lane -> counts."""
    n = max(1, int(window // bucket))
    with Session(reader(engine)) as s:
        now = float(s.execute(select(db_now())).scalar_one())
        start = now - n * bucket
        floor_id = s.execute(
            select(Event.id).order_by(Event.id.desc()).offset(RECENT_EVENTS).limit(1)
        ).scalar_one_or_none()
        slot = _bucket_expr(engine, start, bucket).label("slot")
        q = (
            select(Event.lane, slot, func.count())
            .where(Event.type.in_(FINISH_EVENTS), Event.at >= start, Event.lane.is_not(None))
            .group_by(Event.lane, slot)
        )
        if floor_id is not None:
            q = q.where(Event.id > floor_id)
        if lanes is not None:
            q = q.where(Event.lane.in_(tuple(lanes)))
        rows = s.execute(q).all()
    out: dict[str, list[int]] = {}
    for lane, i, count in rows:
        series = out.setdefault(lane, [0] * n)
        if 0 <= int(i) < n:
            series[int(i)] += int(count)
    return start, out


ETA_BUCKET = 10.0  # seconds per bucket of the busy-time query
IDLE_GAP = 120.0  # no claim and no finish in a lane for this long: it was idle, its rate restarts after
ETA_MIN_FINISHED = 10  # an ETA is shown once its lanes' rates rest on this many finished items ...
ETA_MIN_SPAN = 5.0  # ... over at least this many seconds of busy time


@dataclass(frozen=True)
class LaneRate:
    """A lane's measured rate: ``finished`` items over ``busy`` seconds of work since ``since``."""

    finished: int
    busy: float
    since: float

    @property
    def per_second(self) -> float:
        return self.finished / self.busy if self.busy > 0 else 0.0

    @property
    def stable(self) -> bool:
        return self.finished >= ETA_MIN_FINISHED and self.busy >= ETA_MIN_SPAN


def lane_rates(
    engine: Engine, lanes: Collection[str], *, window: float = ETA_WINDOW, busy_now: Collection[str] = ()
) -> dict[str, LaneRate]:
    """Each lane's rate over the time it has actually been busy within the last ``window`` seconds:
    items finished (succeeded or failed) since its work started — its first claim or finish after
    the last gap of ``IDLE_GAP`` seconds with neither — divided by the time from then to now while
    it is still busy (``busy_now``: lanes with unfinished work), else to its last finish. One
    grouped read of the newest ``RECENT_EVENTS`` events (``ETA_BUCKET``-second buckets with their
    first and last event times), so a lane busy for 30 s is not divided by 10 minutes."""
    if not lanes:
        return {}
    bucket = ETA_BUCKET
    with Session(reader(engine)) as s:
        now = float(s.execute(select(db_now())).scalar_one())
        start = now - window
        floor_id = s.execute(
            select(Event.id).order_by(Event.id.desc()).offset(RECENT_EVENTS).limit(1)
        ).scalar_one_or_none()
        slot = _bucket_expr(engine, start, bucket).label("slot")
        finished = func.sum(case((Event.type.in_(FINISH_EVENTS), 1), else_=0))
        q = (
            select(Event.lane, slot, finished, func.min(Event.at), func.max(Event.at))
            .where(
                Event.type.in_((*FINISH_EVENTS, "item_claimed")),
                Event.at >= start,
                Event.lane.in_(tuple(lanes)),
            )
            .group_by(Event.lane, slot)
        )
        if floor_id is not None:
            q = q.where(Event.id > floor_id)
        rows = s.execute(q).all()
    by_lane: dict[str, list[tuple[int, int, float, float]]] = {}
    for lane, i, n, first, last in rows:
        by_lane.setdefault(lane, []).append((int(i), int(n or 0), float(first), float(last)))
    out: dict[str, LaneRate] = {}
    for lane in lanes:
        buckets = sorted(by_lane.get(lane, []))
        if not buckets:
            out[lane] = LaneRate(0, 0.0, now)
            continue
        begin = 0
        for k in range(1, len(buckets)):
            if buckets[k][2] - buckets[k - 1][3] > IDLE_GAP:
                begin = k  # idle before this bucket: the rate starts after the gap
        run = buckets[begin:]
        since = run[0][2]
        end = now if lane in busy_now else run[-1][3]
        out[lane] = LaneRate(sum(b[1] for b in run), max(0.0, end - since), since)
    return out


# -- failure groups: their items, retry and discard ------------------------------------------------------
def group_items(engine: Engine, job_id: int, lane: str, state: str, reason: str) -> list[int]:
    """The ids of a job's items in one failure group (lane, state, reason class), in id order."""
    with Session(reader(engine)) as s:
        if s.get(Job, job_id) is None:
            raise UnknownJob(job_id)
        rows = s.execute(
            select(Item.id, Item.error, Photo.path)
            .outerjoin(Photo, Photo.id == Item.photo_id)
            .where(Item.job_id == job_id, Item.lane == lane, Item.state == state)
            .order_by(Item.id)
        ).all()
    return [r.id for r in rows if reason_class(r.error, [r.path]) == reason]


class UnknownItem(LookupError):
    def __init__(self, job_id: int, item_id: int) -> None:
        self.job_id = job_id
        self.item_id = item_id
        super().__init__(f"job {job_id} has no item {item_id}")


class NothingToDiscard(NotApplicable):
    def __init__(self, job_id: int) -> None:
        self.job_id = job_id
        super().__init__(f"job {job_id} has none of these items failed: nothing to discard")


def discard(engine: Engine, job_id: int, item_ids: Collection[int]) -> int:
    """Give up on failed items: each of ``item_ids`` that is ``failed`` in the job becomes
    ``skipped`` (its error kept; a retry of the job no longer picks it up), with an
    ``item_discarded`` event. Under the job's row lock (the lock order: job, then its items), as
    retry and cancel take it. Returns how many changed; ``NothingToDiscard`` when none did."""
    ids = sorted({int(i) for i in item_ids})
    with Session(engine) as s, s.begin():
        job = s.execute(job_for_change(job_id, Job.id)).first()
        if job is None:
            raise UnknownJob(job_id)
        changed = []
        for start in range(0, len(ids), 500):
            changed += s.execute(
                update(Item)
                .where(Item.id.in_(ids[start : start + 500]), Item.job_id == job_id, Item.state == FAILED)
                .values(state=SKIPPED, updated_at=db_now())
                .returning(Item.id, Item.lane, Item.photo_id, Item.fencing_token)
            ).all()
        if not changed:
            raise NothingToDiscard(job_id)
        emit_many(
            s,
            [
                {
                    "type": DISCARDED,
                    "job_id": job_id,
                    "item_id": r.id,
                    "photo_id": r.photo_id,
                    "lane": r.lane,
                    "token": r.fencing_token,
                    "detail": {"from": FAILED, "state": SKIPPED},
                }
                for r in sorted(changed, key=lambda r: r.id)
            ],
        )
    return len(changed)


# -- an item's attempts, the event feed ---------------------------------------------------------------
ATTEMPT_ENDS = ("item_succeeded", "item_failed", "item_retry_scheduled", "lease_expired", "item_released")
FEED_SCAN = 200_000  # a filtered feed reads at most the newest this many events


def item_history(engine: Engine, job_id: int, item_id: int) -> dict[str, Any]:
    """An item of a job with its attempts, oldest first — each claim (``token``) with its worker,
    claim and end times, queue wait, run time, outcome, error and (an unexpected exception's)
    bounded traceback, from the item's events — and every event of the item. ``UnknownJob`` /
    ``UnknownItem`` when either is missing (or the item is another job's)."""
    assign_cursors(engine)
    with Session(reader(engine)) as s:
        if s.get(Job, job_id) is None:
            raise UnknownJob(job_id)
        row = s.execute(
            select(Item, Photo.path)
            .outerjoin(Photo, Photo.id == Item.photo_id)
            .where(Item.id == item_id, Item.job_id == job_id)
        ).first()
        if row is None:
            raise UnknownItem(job_id, item_id)
        events = list(
            s.execute(
                select(Event)
                .where(Event.job_id == job_id, Event.item_id == item_id, Event.seq.is_not(None))
                .order_by(Event.seq)
            ).scalars()
        )
    item, path = row
    attempts: dict[int, dict[str, Any]] = {}
    for e in events:
        detail = e.detail if isinstance(e.detail, dict) else {}
        if e.type == "item_claimed" and e.token is not None:
            attempts[e.token] = {
                "attempt": e.attempt,
                "token": e.token,
                "worker": e.worker,
                "claimed_at": e.at,
                "waited": detail.get("waited"),
                "ended_at": None,
                "ran": None,
                "outcome": "running",
                "error": None,
                "traceback": None,
            }
        elif e.type in ATTEMPT_ENDS and e.token is not None:
            a = attempts.get(e.token)
            if a is None and e.type == "lease_expired":
                a = attempts.get(e.token - 1)  # the sweeper's revocation bumps the token
            if a is None or a["ended_at"] is not None:
                continue
            a.update(
                ended_at=e.at,
                ran=max(0.0, e.at - a["claimed_at"]),
                outcome=e.type.removeprefix("item_"),
                error=detail.get("error") or detail.get("reason"),
                traceback=detail.get("traceback"),
            )
    return {
        "item": {
            "id": item.id,
            "job": item.job_id,
            "lane": item.lane,
            "state": item.state,
            "photo": item.photo_id,
            "path": path,
            "attempt": item.attempt,
            "error": item.error,
            "worker": item.lease_owner,
            "updated_at": item.updated_at,
        },
        "attempts": sorted(attempts.values(), key=lambda a: a["token"]),
        "events": [record_of(e).as_dict() for e in events],
    }


def feed(
    engine: Engine,
    *,
    job_id: int | None = None,
    item_id: int | None = None,
    types: Collection[str] = (),
    limit: int = 50,
    after: int | None = None,
) -> list[EventRecord]:
    """Events of a job, an item and/or some types: with ``after``, the next ``limit`` in cursor
    order; without, the newest ``limit`` (oldest first). A filter by type alone reads at most the
    newest ``FEED_SCAN`` events (no index on the type)."""
    assign_cursors(engine)
    q = select(Event).where(Event.seq.is_not(None))
    if job_id is not None:
        q = q.where(Event.job_id == job_id)
    if item_id is not None:
        q = q.where(Event.item_id == item_id)
    if types:
        q = q.where(Event.type.in_(tuple(types)))
    with Session(reader(engine)) as s:
        if types and job_id is None:
            newest = s.execute(select(func.max(Event.seq))).scalar_one_or_none() or 0
            q = q.where(Event.seq > newest - FEED_SCAN)
        if after is not None:
            rows = list(s.execute(q.where(Event.seq > after).order_by(Event.seq).limit(limit)).scalars())
        else:
            rows = list(reversed(list(s.execute(q.order_by(Event.seq.desc()).limit(limit)).scalars())))
    return [record_of(e) for e in rows]


# -- bulk actions over the jobs a filter matches ------------------------------------------------------------
MAX_BULK = 10_000  # jobs one bulk action may change


def matching_jobs(engine: Engine, *, state: str | None, query: str | None, cap: int = MAX_BULK) -> list[int]:
    """The ids of every job the console's filter (``find_jobs``) matches, newest first, at most
    ``cap`` + 1 (one more says the match is too large)."""
    ids: list[int] = []
    after: int | None = None
    while len(ids) <= cap:
        page, after = find_jobs(engine, state=state, query=query, limit=MAX_PAGE, after=after)
        ids += [st.job_id for st in page]
        if after is None:
            break
    return ids[: cap + 1]


def failed_items(engine: Engine, job_id: int) -> list[int]:
    """The ids of a job's failed items (``ix_items_settled_job`` then the job's items)."""
    with Session(reader(engine)) as s:
        return list(
            s.execute(
                select(Item.id).where(Item.job_id == job_id, Item.state == FAILED).order_by(Item.id)
            ).scalars()
        )
