"""Jobs: submission, status, and the cancel / pause / resume requests."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, func, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from photojobs.lanes import LaneSpec

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
    TERMINAL,
    WAITING,
    Item,
    ItemPhoto,
    Job,
    Photo,
)

SUBMIT_LOCK = 0x7375626D6974  # "submit"
CHUNK = 2000


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
    """Write the job, its photos and its items in one transaction and return at once.

    Each photo gets one item per lane; the first lane's items are ``pending``, the others
    ``waiting`` on the lane before. A lane in ``bundle_lanes`` gets one item for all the photos
    (``item_photos``), ready once every item of the lane before has ended. Raises ``BacklogFull``
    when a lane's unfinished items plus the new ones would exceed the lane's backlog bound, and
    ``SubmissionError`` for no photos or lanes.
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
    with Session(engine) as s, s.begin():
        if engine.dialect.name == "postgresql":
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SUBMIT_LOCK})
        for spec in lanes:
            backlog = s.execute(
                select(func.count())
                .select_from(Item)
                .where(Item.lane == spec.name, Item.state.not_in(tuple(TERMINAL)))
            ).scalar_one()
            if backlog + len(photos) > spec.backlog:
                raise BacklogFull(spec.name, backlog, len(photos), spec.backlog)
        now = s.execute(select(db_now())).scalar_one()
        job_id = s.execute(
            insert(Job)
            .values(
                lanes=[sp.name for sp in lanes],
                params=params,
                roots=list(roots),
                fingerprint=fp,
                created_at=now,
            )
            .returning(Job.id)
        ).scalar_one()
        photo_ids = _photo_ids(s, engine, photos, now)
        bundled = {pos for pos, sp in enumerate(lanes) if sp.name in bundle_lanes}
        n_items = 0
        for start in range(0, len(paths), CHUNK):
            chunk = paths[start : start + CHUNK]
            rows = [
                {
                    "job_id": job_id,
                    "lane": spec.name,
                    "position": pos,
                    "photo_id": photo_ids[p],
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
            if not rows:
                continue
            created = s.execute(
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
                    for r in created
                ],
            )
            n_items += len(created)
        for pos in sorted(bundled):
            n_items += _bundle_item(s, job_id, lanes[pos].name, pos, list(photo_ids.values()), now)
        emit(
            s,
            "job_submitted",
            job_id=job_id,
            detail={"lanes": [sp.name for sp in lanes], "photos": len(photos), "items": n_items},
        )
    return Submitted(job_id=job_id, items=n_items, photos=len(photos))


def _bundle_item(s: Session, job_id: int, lane: str, pos: int, photo_ids: list[int], now: float) -> int:
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
    s.execute(insert(ItemPhoto), [{"item_id": item_id, "photo_id": p} for p in sorted(photo_ids)])
    emit(
        s,
        "item_created",
        job_id=job_id,
        item_id=item_id,
        lane=lane,
        detail={"state": state, "photos": len(photo_ids)},
    )
    return 1


def _photo_ids(s: Session, engine: Engine, photos: Sequence[PhotoInput], now: float) -> dict[str, int]:
    ids: dict[str, int] = {}
    for start in range(0, len(photos), CHUNK):
        chunk = photos[start : start + CHUNK]
        stmt = _insert_ignore(engine)
        # a known photo keeps the file time recorded first (rename names stay stable across edits)
        stmt = stmt.on_conflict_do_update(
            index_elements=["path"],
            set_={"file_time": stmt.excluded.file_time},
            where=Photo.file_time.is_(None),
        )
        s.execute(
            stmt, [{"path": p.path, "size": p.size, "file_time": p.mtime, "updated_at": now} for p in chunk]
        )
        for pid, path in s.execute(
            select(Photo.id, Photo.path).where(Photo.path.in_([p.path for p in chunk]))
        ):
            ids[path] = pid
    return ids


def find_job_by_fingerprint(engine: Engine, fingerprint: str) -> int | None:
    """The newest job with this fingerprint, if any (``photojobs run`` resumes it)."""
    with Session(reader(engine)) as s:
        return s.execute(
            select(Job.id).where(Job.fingerprint == fingerprint).order_by(Job.id.desc()).limit(1)
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

    def totals(self) -> dict[str, int]:
        out = dict.fromkeys(ALL_STATES, 0)
        for counts in self.lanes.values():
            for st, n in counts.items():
                out[st] += n
        return out

    def as_dict(self) -> dict[str, Any]:
        return {"job": self.job_id, "state": self.state, "control": self.control, "lanes": self.lanes}


def derive_job_state(control: str | None, totals: Mapping[str, int]) -> str:
    """A job's state follows from its items and its control request (one place decides it)."""
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
        lanes: dict[str, dict[str, int]] = {name: {} for name in job.lanes}
        for lane, state, n in s.execute(
            select(Item.lane, Item.state, func.count())
            .where(Item.job_id == job_id)
            .group_by(Item.lane, Item.state)
        ):
            lanes.setdefault(lane, {})[state] = n
        status = JobStatus(
            job_id=job.id,
            state="",
            control=job.control,
            lanes=lanes,
            lane_order=list(job.lanes),
            params=dict(job.params or {}),
            created_at=job.created_at,
        )
        status.state = derive_job_state(job.control, status.totals())
        return status


def list_jobs(engine: Engine, limit: int = 20) -> list[JobStatus]:
    with Session(reader(engine)) as s:
        ids = s.execute(select(Job.id).order_by(Job.id.desc()).limit(limit)).scalars().all()
    return [job_status(engine, i) for i in ids]


def _set_items(
    s: Session, job_id: int, from_states: Sequence[str], to_state: str, event: str, why: str
) -> int:
    rows = s.execute(
        update(Item)
        .where(Item.job_id == job_id, Item.state.in_(tuple(from_states)))
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


def failure_reasons(engine: Engine, job_id: int, top: int = 3) -> dict[str, list[tuple[str, int]]]:
    """Per lane, the most frequent errors of failed items: {lane: [(error, count), …]}."""
    out: dict[str, list[tuple[str, int]]] = {}
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.lane, Item.error, func.count().label("n"))
            .where(Item.job_id == job_id, Item.state == FAILED)
            .group_by(Item.lane, Item.error)
            .order_by(func.count().desc())
        ).all()
    for lane, error, n in rows:
        if len(out.setdefault(lane, [])) < top:
            out[lane].append((error or "unknown error", n))
    return out


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
