"""Jobs: submission, status, and the cancel / pause / resume requests."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from store.lanes import LaneSpec

from .clock import db_now
from .engine import reader
from .errors import BacklogFull, SubmissionError, UnknownJob
from .events import emit, emit_many
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
    ItemPhoto,
    Job,
    Photo,
)

SUBMIT_LOCK = 0x7375626D6974  # "submit"


@dataclass(frozen=True)
class PhotoInput:
    path: str
    size: int | None = None
    mtime: float | None = None  # the file's modification time at submission (photos.file_time)


@dataclass(frozen=True)
class Submitted:
    job_id: int
    items: int
    photos: int


def job_fingerprint(lanes: Sequence[str], paths: Sequence[str], params: Mapping[str, Any]) -> str:
    """Identifies "the same job" (same paths, lanes and params) so a rerun can resume it."""
    payload = json.dumps(
        {"lanes": list(lanes), "paths": sorted(paths), "params": dict(params)}, sort_keys=True
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def _insert_ignore(engine: Engine):  # type: ignore[no-untyped-def]
    return (postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert)(Photo)


# Chunked submission: each chunk is its own transaction. On SQLite it is sized to hold the single
# write lock for about CHUNK_TARGET seconds (CHUNK_MIN..CHUNK_MAX photos) and the submitter then waits
# as long as the chunk took, so heartbeats, claims and the sweeper (whose busy handler polls the
# lock) get in between chunks instead of waiting out a 100,000-photo transaction. On PostgreSQL
# (row locks only) a chunk is CHUNK_MAX photos.
CHUNK_FIRST = 500
CHUNK_MIN = 100
CHUNK_MAX = 4000
CHUNK_TARGET = 0.05
NOT_TERMINAL = (WAITING, PENDING, QUEUED, RUNNING, PAUSED)


class SubmissionCancelled(SubmissionError):
    """The job was cancelled while its photos were still being submitted; nothing more was written."""

    def __init__(self, job_id: int, landed: int, total: int) -> None:
        self.job_id = job_id
        self.landed = landed
        self.total = total
        super().__init__(
            f"job {job_id} was cancelled while it was being submitted ({landed} of {total} photos written)"
        )


def _backlogs(s: Session, lanes: Sequence[LaneSpec]) -> dict[str, int]:
    """Per lane: unfinished items, plus the photos that submissions in flight have announced but not
    written yet (so two concurrent submissions cannot both pass the bound)."""
    out = {}
    for spec in lanes:
        out[spec.name] = s.execute(
            select(func.count()).select_from(Item).where(Item.lane == spec.name, Item.state.in_(NOT_TERMINAL))
        ).scalar_one()
    in_flight = s.execute(
        select(Job.lanes, Job.photos, Job.landed).where(
            Job.submitting == True,  # noqa: E712 - renders "= 1"/"= true", matching ix_jobs_submitting
            Job.control.is_distinct_from(CANCEL),
        )
    ).all()
    for job_lanes, total, landed in in_flight:
        for name in job_lanes or ():
            if name in out:
                out[name] += max(0, (total or 0) - (landed or 0))
    return out


def _check_backlog(backlogs: Mapping[str, int], lanes: Sequence[LaneSpec], adding: int) -> None:
    for spec in lanes:
        if backlogs[spec.name] + adding > spec.backlog:
            raise BacklogFull(spec.name, backlogs[spec.name], adding, spec.backlog)


def submit(
    engine: Engine,
    lanes: Sequence[LaneSpec],
    photos: Sequence[PhotoInput],
    *,
    params: Mapping[str, Any] | None = None,
    roots: Sequence[str] = (),
    fingerprint: str | None = None,
    bundle_lanes: Sequence[str] = (),
) -> Submitted:
    """Write the job, its photos and its items, in bounded chunks, and return the job id.

    Each photo gets one item per lane; the first lane's items are ``pending``, the others
    ``waiting`` on the lane before. A lane in ``bundle_lanes`` gets one item for all the photos
    (``item_photos``), ready once every item of the lane before has ended.

    The first transaction checks the backlog and writes the job as ``submitting``; the photos and
    items follow in chunks of at most ``CHUNK_MAX`` photos (each transaction short, see
    ``CHUNK_TARGET``); the last one clears ``submitting`` and writes ``job_submitted``. Items of a
    job still submitting are not dispatched, so a submitter that dies half-way leaves an inert job
    that ``status`` shows as ``submitting`` and that can be cancelled. Raises ``BacklogFull``
    (before anything is written) when a lane's unfinished items plus the new ones would exceed the
    lane's backlog bound, ``SubmissionError`` for no photos or lanes, and ``SubmissionCancelled``
    when the job is cancelled before its last chunk.
    """
    if not lanes:
        raise SubmissionError("a job needs at least one lane")
    if not photos:
        raise SubmissionError("a job needs at least one photo; no files were found in the given paths")
    params = dict(params or {})
    paths = [p.path for p in photos]
    if len(set(paths)) != len(paths):
        raise SubmissionError("the same photo path is given twice")
    fp = fingerprint or job_fingerprint([s.name for s in lanes], paths, params)
    postgres = engine.dialect.name == "postgresql"
    if not postgres:
        # SQLite: count in a read transaction; the write lock is held only to create the job.
        with Session(reader(engine)) as s:
            _check_backlog(_backlogs(s, lanes), lanes, len(photos))
    bundled = {pos for pos, sp in enumerate(lanes) if sp.name in bundle_lanes}
    with Session(engine) as s, s.begin():
        if postgres:
            # Serializes submitters' backlog checks (nothing else waits on this lock).
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SUBMIT_LOCK})
            _check_backlog(_backlogs(s, lanes), lanes, len(photos))
        now = s.execute(select(db_now())).scalar_one()
        job_id = s.execute(
            insert(Job)
            .values(
                lanes=[sp.name for sp in lanes],
                params=params,
                roots=list(roots),
                fingerprint=fp,
                created_at=now,
                submitting=True,
                photos=len(photos),
                landed=0,
                submit_touched_at=now,
            )
            .returning(Job.id)
        ).scalar_one()
        bundles = {
            pos: _bundle_item(s, job_id, lanes[pos].name, pos, len(photos), now) for pos in sorted(bundled)
        }
    n_items = len(bundles)
    # PostgreSQL has no store-wide write lock: chunks of CHUNK_MAX photos keep its transactions
    # short without paying a commit per few hundred photos. SQLite: sized by the time they take.
    start, size = 0, CHUNK_MAX if postgres else CHUNK_FIRST
    while start < len(photos):
        chunk = photos[start : start + size]
        t0 = time.perf_counter()
        landed = _land_chunk(engine, job_id, lanes, chunk, bundled, bundles, start, len(photos))
        if landed is None:
            raise SubmissionCancelled(job_id, start, len(photos))
        n_items += landed
        took = time.perf_counter() - t0
        start += len(chunk)
        if not postgres:
            size = max(CHUNK_MIN, min(CHUNK_MAX, int(len(chunk) * CHUNK_TARGET / max(took, 1e-3))))
            if start < len(photos):
                time.sleep(min(took, 4 * CHUNK_TARGET))  # let waiting writers take the lock
    with Session(engine) as s, s.begin():
        _submission_control(s, job_id)  # ordered after a concurrent cancel/pause of the job
        s.execute(update(Job).where(Job.id == job_id).values(submitting=False, submit_touched_at=db_now()))
        emit(
            s,
            "job_submitted",
            job_id=job_id,
            detail={"lanes": [sp.name for sp in lanes], "photos": len(photos), "items": n_items},
        )
    return Submitted(job_id=job_id, items=n_items, photos=len(photos))


def _submission_control(s: Session, job_id: int) -> str | None:
    """The job's control request, read under a share lock (a concurrent cancel/pause waits for us)."""
    return s.execute(select(Job.control).where(Job.id == job_id).with_for_update(read=True)).scalar_one()


def _land_chunk(
    engine: Engine,
    job_id: int,
    lanes: Sequence[LaneSpec],
    chunk: Sequence[PhotoInput],
    bundled: set[int],
    bundles: Mapping[int, int],
    start: int,
    total: int,
) -> int | None:
    """One chunk of a submission in one transaction: its photos, their items and events. Returns
    the number of items written, or None when the job was cancelled (the submission is closed)."""
    with Session(engine) as s, s.begin():
        if _submission_control(s, job_id) == CANCEL:
            s.execute(
                update(Job).where(Job.id == job_id).values(submitting=False, submit_touched_at=db_now())
            )
            created = s.execute(
                select(func.count()).select_from(Item).where(Item.job_id == job_id)
            ).scalar_one()
            emit(
                s,
                "job_submitted",
                job_id=job_id,
                detail={
                    "lanes": [sp.name for sp in lanes],
                    "photos": start,
                    "items": created,
                    "cancelled": True,
                },
            )
            return None
        now = s.execute(select(db_now())).scalar_one()
        photo_ids = _photo_ids(s, engine, chunk, now)
        rows = [
            {
                "job_id": job_id,
                "lane": spec.name,
                "position": pos,
                "photo_id": photo_ids[p.path],
                "state": PENDING if pos == 0 else WAITING,
                "attempt": 0,
                "fencing_token": 0,
                "not_before": 0.0,
                "updated_at": now,
            }
            for p in chunk
            for pos, spec in enumerate(lanes)
            if pos not in bundled
        ]
        n = 0
        if rows:
            created_rows = s.execute(
                insert(Item).returning(
                    Item.id, Item.photo_id, Item.lane, Item.state, sort_by_parameter_order=True
                ),
                rows,
            ).all()
            emit_many(
                s,
                [
                    {
                        "type": "item_created",
                        "job_id": job_id,
                        "item_id": r.id,
                        "photo_id": r.photo_id,
                        "lane": r.lane,
                        "detail": {"state": r.state},
                    }
                    for r in created_rows
                ],
            )
            n = len(created_rows)
        ids = sorted({photo_ids[p.path] for p in chunk})
        for item_id in bundles.values():
            s.execute(insert(ItemPhoto), [{"item_id": item_id, "photo_id": p} for p in ids])
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(landed=Job.landed + len(chunk), submit_touched_at=db_now())
        )
    return n


def _bundle_item(s: Session, job_id: int, lane: str, pos: int, photos: int, now: float) -> int:
    """The one item of a bundle lane; its photos (``item_photos``) land with the chunks."""
    state = PENDING if pos == 0 else WAITING
    item_id = s.execute(
        insert(Item)
        .values(
            job_id=job_id,
            lane=lane,
            position=pos,
            photo_id=None,
            state=state,
            attempt=0,
            fencing_token=0,
            not_before=0.0,
            updated_at=now,
        )
        .returning(Item.id)
    ).scalar_one()
    emit(
        s,
        "item_created",
        job_id=job_id,
        item_id=item_id,
        lane=lane,
        detail={"state": state, "photos": photos},
    )
    return item_id


def _photo_ids(s: Session, engine: Engine, photos: Sequence[PhotoInput], now: float) -> dict[str, int]:
    photos = sorted(photos, key=lambda p: p.path)  # new rows in one order across submissions
    if engine.dialect.name == "postgresql":
        # The known photos' rows first, in ascending id, the one order every transaction that locks
        # several photos keeps (a batch claim, a bundle): the upsert below would lock them in path
        # order, and a path order crossed with another transaction's id order deadlocked (the long
        # photo chaos run, a submission against a batch claim and a rename).
        known = select(Photo.id).where(Photo.path.in_([p.path for p in photos])).order_by(Photo.id)
        s.execute(known.with_for_update()).all()
    stmt = _insert_ignore(engine)
    # a known photo keeps the file time recorded first (rename names stay stable across edits)
    stmt = stmt.on_conflict_do_update(
        index_elements=["path"],
        set_={"file_time": stmt.excluded.file_time},
        where=Photo.file_time.is_(None),
    )
    rows = [{"path": p.path, "size": p.size, "file_time": p.mtime, "updated_at": now} for p in photos]
    s.execute(stmt, rows)
    return {
        path: pid
        for pid, path in s.execute(
            select(Photo.id, Photo.path).where(Photo.path.in_([p.path for p in photos]))
        )
    }


def find_job_by_fingerprint(engine: Engine, fingerprint: str) -> int | None:
    """The newest fully submitted job with this fingerprint, if any (``photojobs run`` resumes it).

    A job whose submission never finished (its submitter died) is not resumed: it stays
    ``submitting`` for ``status`` to show and ``cancel`` to end, and the rerun submits afresh.
    """
    with Session(reader(engine)) as s:
        return s.execute(
            select(Job.id)
            .where(Job.fingerprint == fingerprint, Job.submitting == False)  # noqa: E712
            .order_by(Job.id.desc())
            .limit(1)
        ).scalar_one_or_none()


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
        return out


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


def _set_items(
    s: Session, job_id: int, from_states: Sequence[str], to_state: str, event: str, why: str
) -> int:
    """The job's items in ``from_states`` become ``to_state`` (the caller holds the job row for
    update). On PostgreSQL they are first locked in ascending id, the order a batch claim and a
    dispatch lock items in: the ``UPDATE`` alone locks them in the order it finds them (heap
    order, which updates shuffle), and a cancel of a 100k-item job that had locked a batch's later
    item while the batch's claim held its earlier one deadlocked with it (CI, December 2026)."""
    where = (Item.job_id == job_id, Item.state.in_(tuple(from_states)))
    if s.get_bind().dialect.name == "postgresql":
        s.execute(select(Item.id).where(*where).order_by(Item.id).with_for_update()).all()
    rows = s.execute(
        update(Item)
        .where(*where)
        .values(state=to_state, queued_at=None, updated_at=db_now())
        .returning(Item.id, Item.photo_id, Item.lane, Item.attempt, Item.fencing_token)
    ).all()
    emit_many(
        s,
        [
            {
                "type": event,
                "job_id": job_id,
                "item_id": r.id,
                "photo_id": r.photo_id,
                "lane": r.lane,
                "attempt": r.attempt,
                "token": r.fencing_token,
                "detail": {"reason": why},
            }
            for r in rows
        ],
    )
    return len(rows)


def _control(engine: Engine, job_id: int) -> tuple[Session, Job]:
    """Open a control transaction: the job row is locked for update first, then (by the caller) its
    items — the global lock order job -> item -> photo -> intent (see ``store.items``). Intents of
    items this stops are settled by the sweeper (``store.intents.settle_orphans``)."""
    s = Session(engine)
    s.begin()
    job = s.execute(select(Job).where(Job.id == job_id).with_for_update()).scalar_one_or_none()
    if job is None:
        s.rollback()
        s.close()
        raise UnknownJob(job_id)
    return s, job


def cancel(engine: Engine, job_id: int) -> int:
    """Cancel: not-yet-running items become ``cancelled`` now; running ones are asked to stop."""
    s, job = _control(engine, job_id)
    with s:
        job.control = CANCEL
        n = _set_items(
            s, job_id, (WAITING, PENDING, QUEUED, PAUSED), CANCELLED, "item_cancelled", "job cancelled"
        )
        emit(s, "job_cancel_requested", job_id=job_id, detail={"cancelled_now": n})
        s.commit()
    return n


def pause(engine: Engine, job_id: int) -> int:
    """Pause: pending/queued items become ``paused``; running ones stop at their next checkpoint.

    Waiting items stay waiting; when their turn comes during the pause they become paused.
    """
    s, job = _control(engine, job_id)
    with s:
        if job.control == CANCEL:
            s.rollback()
            return 0
        job.control = PAUSE
        n = _set_items(s, job_id, (PENDING, QUEUED), PAUSED, "item_paused", "job paused")
        emit(s, "job_pause_requested", job_id=job_id, detail={"paused_now": n})
        s.commit()
    return n


def resume(engine: Engine, job_id: int) -> int:
    """Resume a paused job: paused items become ``pending`` again."""
    s, job = _control(engine, job_id)
    with s:
        if job.control == CANCEL:
            s.rollback()
            return 0
        job.control = None
        n = _set_items(s, job_id, (PAUSED,), PENDING, "item_resumed", "job resumed")
        emit(s, "job_resumed", job_id=job_id, detail={"resumed": n})
        s.commit()
    return n


def event_type_counts(engine: Engine, job_id: int, types: Sequence[str]) -> dict[str, int]:
    """How many events of each type the job has (e.g. lease_expired = recoveries)."""
    from .models import Event

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
