"""Submission: a job, its photos and its items written in short chunks (the backlog bound checked first)."""

# ruff: noqa: S608 - the statements here are text built once from constant fragments (the clock)

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, insert, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import BacklogFull, NotApplicable, SubmissionError
from .events import emit
from .idempotency import Idempotency, replay_after_conflict
from .idempotency import check as check_key
from .idempotency import claim as claim_key
from .job_end import touched
from .lanes import LaneSpec
from .models import CANCEL, PENDING, WAITING, Item, Job
from .pipeline import UNFINISHED, lock_job
from .priority import PRIORITIES
from .queries import sql_now

log = logging.getLogger(__name__)

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


# Chunked submission: each chunk is its own transaction. On SQLite it is sized to hold the single
# write lock for about CHUNK_TARGET seconds (CHUNK_MIN..CHUNK_MAX photos) and the submitter then waits
# as long as the chunk took, so heartbeats, claims and the sweeper (whose busy handler polls the
# lock) get in between chunks instead of waiting out a 100,000-photo transaction. On PostgreSQL
# (row locks only) a chunk is CHUNK_MAX photos.
CHUNK_FIRST = 500
CHUNK_MIN = 100
CHUNK_MAX = 4000
CHUNK_TARGET = 0.05


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
            select(func.count()).select_from(Item).where(Item.lane == spec.name, Item.state.in_(UNFINISHED))
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
    priority: str | None = None,
    idempotency: Idempotency | None = None,
) -> Submitted:
    """Write the job, its photos and its items, in bounded chunks, and return the job id.

    Each photo gets one item per lane; the first lane's items are ``pending``, the others
    ``waiting`` on the lane before. A lane in ``bundle_lanes`` gets one item for all the photos
    (``item_photos``), ready once every item of the lane before has ended.

    The first transaction checks the backlog and writes the job as ``submitting``; the photos and
    items follow in chunks of at most ``CHUNK_MAX`` photos (each transaction short, see
    ``CHUNK_TARGET``); the last one clears ``submitting`` and writes ``job_submitted``. Items of a
    job still submitting are not dispatched, so a submitter that dies half-way leaves an inert job
    that ``status`` shows as ``submitting`` and that can be cancelled (the sweeper ends it once its
    last chunk is ``PHOTOJOBS_SUBMIT_ABANDONED`` old); a submission that fails with an error ends
    its job at once (:func:`end_submission`: cancelled, ``job_submitted`` with ``why``).
    Raises ``BacklogFull``
    (before anything is written) when a lane's unfinished items plus the new ones would exceed the
    lane's backlog bound, ``SubmissionError`` for no photos or lanes, and ``SubmissionCancelled``
    when the job is cancelled before its last chunk. ``priority``: "interactive" or "normal", or
    None to let the job's size decide (``store.dispatch``). ``idempotency``: the request's key,
    checked and recorded with the job in the transaction that creates it (``store.idempotency``):
    raises ``Replay`` (the key's job, nothing written) or ``KeyReused``.
    """
    if priority is not None and priority not in PRIORITIES:
        raise SubmissionError(f"unknown priority {priority!r}; priorities are: {', '.join(PRIORITIES)}")
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
    try:
        job_id, bundles = _create_job(
            engine, lanes, photos, params, roots, fp, bundled, priority, idempotency, postgres
        )
    except IntegrityError:
        if idempotency is None:
            raise
        raise replay_after_conflict(engine, idempotency) from None
    n_items = len(bundles)
    # PostgreSQL has no store-wide write lock: chunks of CHUNK_MAX photos keep its transactions
    # short without paying a commit per few hundred photos. SQLite: sized by the time they take.
    start, size = 0, CHUNK_MAX if postgres else CHUNK_FIRST
    try:
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
            lock_job(s, job_id)  # ordered after a concurrent cancel/pause of the job
            s.execute(
                update(Job).where(Job.id == job_id).values(submitting=False, submit_touched_at=db_now())
            )
            emit(
                s,
                "job_submitted",
                job_id=job_id,
                detail={"lanes": [sp.name for sp in lanes], "photos": len(photos), "items": n_items},
            )
            touched(s, job_id)  # a job whose items all ended while it landed (or with none) is finished
    except SubmissionCancelled:
        raise
    except BaseException as exc:  # never a job left submitting by a submitter that is still alive
        end_submission(engine, job_id, f"the submission failed: {type(exc).__name__}")
        raise
    return Submitted(job_id=job_id, items=n_items, photos=len(photos))


def _create_job(
    engine: Engine,
    lanes: Sequence[LaneSpec],
    photos: Sequence[PhotoInput],
    params: Mapping[str, Any],
    roots: Sequence[str],
    fp: str,
    bundled: set[int],
    priority: str | None,
    idempotency: Idempotency | None,
    postgres: bool,
) -> tuple[int, dict[int, int]]:
    """The submission's first transaction: the idempotency key checked, the backlog checked (on
    PostgreSQL), the job written as ``submitting`` with its bundle items, and the key recorded with
    it. The key's check runs under the lock this transaction holds (the submitters' advisory lock,
    SQLite's write lock), so two requests with one key cannot both pass it."""
    with Session(engine) as s, s.begin():
        if postgres:
            # Serializes submitters' backlog checks (nothing else waits on this lock).
            s.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": SUBMIT_LOCK})
        if idempotency is not None:
            check_key(s, idempotency)  # raises Replay / KeyReused: nothing is written
        if postgres:
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
                priority=priority,  # None: by its size (store.dispatch.is_interactive_sql)
            )
            .returning(Job.id)
        ).scalar_one()
        bundles = {
            pos: _bundle_item(s, job_id, lanes[pos].name, pos, len(photos), now) for pos in sorted(bundled)
        }
        if idempotency is not None:
            claim_key(s, idempotency, job_id)
    return job_id, bundles


def end_submission(engine: Engine, job_id: int, why: str) -> bool:
    """End a submission that will not complete (its submitter failed, or died: the sweeper): the
    job is cancelled (its landed items ``cancelled``), ``submitting`` cleared and ``job_submitted``
    written with ``cancelled`` and ``why``. True when it ended it; False when it was no longer
    submitting or the store could not be reached (the sweeper ends it later)."""
    from .control import cancel

    try:
        with Session(engine) as s:
            job = s.get(Job, job_id)
            if job is None or not job.submitting:
                return False
            lane_names = list(job.lanes)
        try:
            cancel(engine, job_id)
        except NotApplicable:
            pass  # cancelled already (by an operator): its submission still ends here
        with Session(engine) as s, s.begin():
            lock_job(s, job_id)
            ended = s.execute(
                update(Job)
                .where(Job.id == job_id, Job.submitting == True)  # noqa: E712
                .values(submitting=False, submit_touched_at=db_now())
            ).rowcount
            if not ended:
                return False
            created = s.execute(
                select(func.count()).select_from(Item).where(Item.job_id == job_id)
            ).scalar_one()
            emit(
                s,
                "job_submitted",
                job_id=job_id,
                detail={"lanes": lane_names, "items": created, "cancelled": True, "why": why},
            )
            touched(s, job_id)
        return True
    except Exception:  # noqa: BLE001 - best effort: the caller re-raises its own error
        log.warning("could not end the failed submission of job %s", job_id, exc_info=True)
        return False


#: A submission whose last chunk is this old (PHOTOJOBS_SUBMIT_ABANDONED) lost its submitter.
SUBMIT_ABANDONED = 600.0


def end_abandoned_submissions(engine: Engine, after: float = SUBMIT_ABANDONED) -> int:
    """End (:func:`end_submission`) every submission whose last chunk landed more than ``after``
    seconds ago (database time): its submitter died. A live submitter writes a chunk every few
    hundred milliseconds. The sweeper runs this; returns how many it ended."""
    with Session(reader(engine)) as s:
        stale = (
            s.execute(
                select(Job.id).where(
                    Job.submitting == True,  # noqa: E712 - served by ix_jobs_submitting
                    func.coalesce(Job.submit_touched_at, Job.created_at) < db_now() - after,
                )
            )
            .scalars()
            .all()
        )
    why = f"its submitter stopped for over {after:g} s"
    return sum(end_submission(engine, job_id, why) for job_id in stale)


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
        if lock_job(s, job_id) == CANCEL:
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
            touched(s, job_id)
            return None
        if engine.dialect.name == "postgresql":
            n = _land_rows_pg(s, job_id, lanes, chunk, bundled, bundles)
        else:
            n = _land_rows(s, job_id, lanes, chunk, bundled, bundles)
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(landed=Job.landed + len(chunk), submit_touched_at=db_now())
        )
    return n


# SQLite: the chunk's rows as executemany at the driver (in-process, no ORM work per row), and the
# items' events from the rows just written: under the store's write lock the new items are exactly
# those above the largest id before the insert (rowids are handed out above the largest one).
_PHOTOS_SQLITE = """
    INSERT INTO photos (path, size, file_time, updated_at) VALUES (?, ?, ?, ?)
    ON CONFLICT (path) DO UPDATE SET file_time = excluded.file_time WHERE photos.file_time IS NULL
"""
_PHOTO_IDS_SQLITE = text("SELECT id, path FROM photos WHERE path IN (SELECT value FROM json_each(:paths))")
_ITEMS_SQLITE = """
    INSERT INTO items (job_id, lane, position, photo_id, state, attempt, fencing_token, not_before,
                       updated_at)
    VALUES (?, ?, ?, ?, ?, 0, 0, 0.0, ?)
"""
_ITEM_EVENTS_SQLITE = text(
    f"""
    INSERT INTO events (type, job_id, item_id, photo_id, lane, detail, at)
    SELECT 'item_created', job_id, id, photo_id, lane, '{{"state": "' || state || '"}}',
           {sql_now("sqlite")}
    FROM items WHERE id > :after ORDER BY id
    """
)


def _land_rows(
    s: Session,
    job_id: int,
    lanes: Sequence[LaneSpec],
    chunk: Sequence[PhotoInput],
    bundled: set[int],
    bundles: Mapping[int, int],
) -> int:
    """SQLite: a chunk's photos, items and events in a fixed few statements (two executemany)."""
    conn = s.connection()
    now = s.execute(select(db_now())).scalar_one()
    ordered = sorted(chunk, key=lambda p: p.path)  # new rows in one order across submissions
    conn.exec_driver_sql(_PHOTOS_SQLITE, [(p.path, p.size, p.mtime, now) for p in ordered])
    paths = json.dumps([p.path for p in ordered])
    photo_ids = {path: pid for pid, path in s.execute(_PHOTO_IDS_SQLITE, {"paths": paths}).all()}
    ids = [photo_ids[p.path] for p in chunk]
    per_lane = [(pos, spec.name) for pos, spec in enumerate(lanes) if pos not in bundled]
    n = 0
    if per_lane:
        after = s.execute(select(func.coalesce(func.max(Item.id), 0))).scalar_one()
        lane_rows = [(name, pos, PENDING if pos == 0 else WAITING) for pos, name in per_lane]
        conn.exec_driver_sql(
            _ITEMS_SQLITE,
            [(job_id, name, pos, pid, state, now) for pid in ids for name, pos, state in lane_rows],
        )
        n = s.execute(_ITEM_EVENTS_SQLITE, {"after": after}).rowcount
    if bundles:
        unique = sorted(set(ids))
        for item_id in bundles.values():
            conn.exec_driver_sql(
                "INSERT INTO item_photos (item_id, photo_id) VALUES (?, ?)", [(item_id, p) for p in unique]
            )
    return n


# PostgreSQL: a chunk's rows in a few statements whatever its size, each with one parameter set of
# arrays (an executemany goes through psycopg's pipeline row by row, and an ``IN (…)`` of thousands
# of expanded parameters is re-parsed by psycopg at every chunk: most of a submitter's CPU before).
_KNOWN_PHOTOS_PG = text(
    """
    SELECT id, path FROM photos WHERE path = ANY(CAST(:paths AS text[])) ORDER BY id FOR UPDATE
    """
)
_PHOTOS_PG = text(
    f"""
    INSERT INTO photos (path, size, file_time, updated_at)
    SELECT u.path, u.size, u.file_time, {sql_now("postgresql")}
    FROM unnest(CAST(:paths AS text[]), CAST(:sizes AS bigint[]), CAST(:times AS double precision[]))
         WITH ORDINALITY AS u(path, size, file_time, n)
    ORDER BY u.n
    ON CONFLICT (path) DO UPDATE SET file_time = excluded.file_time WHERE photos.file_time IS NULL
    RETURNING id, path
    """
)
_PHOTO_IDS_PG = text("SELECT id, path FROM photos WHERE path = ANY(CAST(:paths AS text[]))")
# The items and their item_created events in one statement: the events are written from the
# inserted rows in item id order (their cursor order within the commit, as before), so no item row
# travels to the client and back.
_ITEMS_PG = text(
    f"""
    WITH new AS (
        INSERT INTO items (job_id, lane, position, photo_id, state, attempt, fencing_token,
                           not_before, updated_at)
        SELECT :job_id, l.lane, l.position, p.photo_id, l.state, 0, 0, 0.0, {sql_now("postgresql")}
        FROM unnest(CAST(:photo_ids AS integer[])) WITH ORDINALITY AS p(photo_id, n)
        CROSS JOIN unnest(CAST(:lanes AS text[]), CAST(:positions AS integer[]),
                          CAST(:states AS text[])) WITH ORDINALITY AS l(lane, position, state, m)
        ORDER BY p.n, l.m
        RETURNING id, photo_id, lane, state
    )
    INSERT INTO events (type, job_id, item_id, photo_id, lane, detail, at)
    SELECT 'item_created', :job_id, new.id, new.photo_id, new.lane,
           CAST('{{"state": "' || new.state || '"}}' AS json), {sql_now("postgresql")}
    FROM new ORDER BY new.id
    """
)
_BUNDLE_PHOTOS_PG = text(
    "INSERT INTO item_photos (item_id, photo_id) SELECT :item_id, unnest(CAST(:photo_ids AS integer[]))"
)


def _land_rows_pg(
    s: Session,
    job_id: int,
    lanes: Sequence[LaneSpec],
    chunk: Sequence[PhotoInput],
    bundled: set[int],
    bundles: Mapping[int, int],
) -> int:
    """PostgreSQL: a chunk's photos, items and events in four statements (five with a bundle lane),
    none with a parameter per row."""
    photo_ids = _photo_ids_pg(s, chunk)
    ids = [photo_ids[p.path] for p in chunk]
    n = 0
    per_lane = [(pos, spec.name) for pos, spec in enumerate(lanes) if pos not in bundled]
    if per_lane:
        # photo by photo, its lanes in order: the item ids keep the order of the executemany before
        n = s.execute(
            _ITEMS_PG,
            {
                "job_id": job_id,
                "photo_ids": ids,
                "lanes": [name for _, name in per_lane],
                "positions": [pos for pos, _ in per_lane],
                "states": [PENDING if pos == 0 else WAITING for pos, _ in per_lane],
            },
        ).rowcount
    if bundles:
        ordered = sorted(set(ids))
        for item_id in bundles.values():
            s.execute(_BUNDLE_PHOTOS_PG, {"item_id": item_id, "photo_ids": ordered})
    return n


def _photo_ids_pg(s: Session, photos: Sequence[PhotoInput]) -> dict[str, int]:
    """The chunk's photo rows, written or found: path -> id. The known ones are locked first in
    ascending id (as :func:`_photo_ids`); the new ones are inserted in path order."""
    photos = sorted(photos, key=lambda p: p.path)  # new rows in one order across submissions
    paths = [p.path for p in photos]
    found = dict(s.execute(_KNOWN_PHOTOS_PG, {"paths": paths}).all())
    ids = {path: pid for pid, path in found.items()}
    written = s.execute(
        _PHOTOS_PG,
        {"paths": paths, "sizes": [p.size for p in photos], "times": [p.mtime for p in photos]},
    ).all()
    ids.update((path, pid) for pid, path in written)
    if len(ids) < len(paths):
        # A row another submission inserted after our lock (its file time kept: not returned).
        missing = [path for path in paths if path not in ids]
        ids.update((path, pid) for pid, path in s.execute(_PHOTO_IDS_PG, {"paths": missing}).all())
    return ids


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
