"""The pipeline: job control, an item's photos, later lanes' items and bundles made ready or skipped."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .events import emit_many
from .models import (
    ALL_STATES,
    CANCEL,
    CANCELLED,
    PAUSE,
    PAUSED,
    PENDING,
    SKIPPED,
    SUCCEEDED,
    TERMINAL,
    WAITING,
    Item,
    ItemPhoto,
    Job,
    Photo,
    unindexed_state,
)
from .photo_locks import chunked
from .queries import item_photos_query, job_control_shared, successors_query, unfinished_in_lane

# The states an item has not ended in (waiting, pending, queued, running, paused), in ALL_STATES order.
UNFINISHED = tuple(state for state in ALL_STATES if state not in TERMINAL)

#: Which lanes' success an item of a lane needs, for the same photo, when that lane comes earlier
#: in the job (README "Which lane waits for which"). A failed item skips only the later items
#: that need it; the first later item that does not runs next. A photo's backup never waits on an
#: edit: upload and archive need nothing (they copy or move the file as it is, the unedited
#: original when the edit failed; they never decode pixels), and neither do analysis and exif
#: (each checks the file itself). rename needs exif: a name is made from the edited metadata (a
#: time shift), so a photo whose edit failed keeps its name. A lane not named needs every lane
#: before it.
NEEDS: dict[str, frozenset[str]] = {
    "analysis": frozenset(),
    "exif": frozenset(),
    "rename": frozenset({"exif"}),
    "upload": frozenset(),
    "archive": frozenset(),
}


def needs(lane: str, earlier: Sequence[str]) -> set[str]:
    """The lanes among ``earlier`` (the job's lanes before ``lane``) whose success ``lane`` needs."""
    return set(NEEDS.get(lane, frozenset(earlier))) & set(earlier)


def lock_job(s: Session, job_id: int) -> str | None:
    """Share-lock the job row and return its control request. Called before any item is touched
    (the global lock order job -> item -> photo -> intent), so a concurrent cancel/pause (which
    locks the job for update, then its items) either sees this transaction's result or waits."""
    return s.execute(job_control_shared(job_id)).scalar_one()


def ready_state(s: Session, job_id: int) -> str:
    """The state an item becomes when it is ready to run: ``pending``, or ``paused``/``cancelled``
    when its job asks so. Reads the job under a share lock so a concurrent cancel/pause (which
    locks the job row for update) sees this transaction's result and sweeps it up."""
    return state_for(lock_job(s, job_id))


def state_for(control: str | None) -> str:
    """The ready state for a job control request."""
    return {CANCEL: CANCELLED, PAUSE: PAUSED}.get(control or "", PENDING)


def item_photo_ids(conn: Connection | Session, item_id: int, photo_id: int | None) -> tuple[int, ...]:
    """The photos an item works on, in ascending id: its photo, or (a bundle, with no single photo)
    its ``item_photos``. The one place an item's photos are looked up."""
    if photo_id is not None:
        return (photo_id,)
    return tuple(sorted(set(conn.execute(item_photos_query(item_id)).scalars())))


def _successors(s: Session, job_id: int, position: int, photo_ids: Iterable[int]) -> list[Any]:
    ids = tuple(photo_ids)
    out: list[Any] = []
    for chunk in chunked(ids):
        out += s.execute(successors_query(job_id, position, chunk)).all()
    return out


def _runnable(s: Session, job_id: int, position: int, items: Sequence[Any]) -> list[Any]:
    """Those of ``items`` (waiting items after ``position``) before the job's next waiting bundle:
    a photo's items after a bundle lane wait for the bundle, which readies them when it ends."""
    if not items:
        return []
    bundle_id = _waiting_bundle(s, job_id, position + 1)
    if bundle_id is None:
        return list(items)
    at = s.execute(select(Item.position).where(Item.id == bundle_id)).scalar_one()
    return [i for i in items if i.position < at]


def lane_unfinished(s: Session, job_id: int, lane: str) -> bool:
    """Has any item of the job's ``lane`` not ended? One seek per unfinished state, so finishing
    an item of a 100,000-photo job does not count the others (a count over the lane's items — and
    before that a scan of the job's items, ``position`` having no index — made it quadratic)."""
    dialect = s.get_bind().dialect.name
    for state in UNFINISHED:
        row = s.execute(unfinished_in_lane(job_id, lane, state, dialect)).first()
        if row is not None and tuple(row) == (job_id, lane, state):
            return True
    return False


def _waiting_bundle(s: Session, job_id: int, position: int, upto: int | None = None) -> int | None:
    """The id of the job's first bundle item at ``position`` or later (up to ``upto``) while it
    waits (no lock)."""
    where = [Item.job_id == job_id, Item.position >= position, Item.photo_id.is_(None), Item.state == WAITING]
    if upto is not None:
        where.append(Item.position <= upto)
    return s.execute(select(Item.id).where(*where).order_by(Item.position).limit(1)).scalar_one_or_none()


def bundle_reach(
    s: Session, job_id: int, position: int, photo_ids: Iterable[int], *, failed: bool
) -> int | None:
    """How far a waiting bundle may lie for ending the photos' items at ``position`` (succeeded, or
    ``failed`` for good) to release it: up to the later item of theirs that runs next (a bundle
    beyond it waits for that item), anywhere (None) when nothing of theirs runs next. Read before
    any row is locked: a photo's later items only wait (nothing else moves them while the job's
    share lock is held)."""
    later = _successors(s, job_id, position, photo_ids)
    if failed:
        lanes = s.execute(select(Job.lanes).where(Job.id == job_id)).scalar_one()
        _, nxt = blocked_and_next(lanes, lanes[position], later)
    else:
        nxt = _first_per_photo(later)
    nxt = _runnable(s, job_id, position, nxt)
    photos = set(photo_ids)
    if not nxt or {i.photo_id for i in nxt} != photos:
        return None
    return max(i.position for i in nxt)


def lock_bundle(
    s: Session, job_id: int, position: int, photo_ids: Iterable[int] = (), *, failed: bool = False
) -> Any:
    """The job's waiting bundle item at ``position`` or later that ending the photos' items before
    it may release (:func:`bundle_reach`; without photos: only one at ``position``), its id, lane,
    token and position, row-locked; None when none waits there. Taken by an ending item of an
    earlier lane, after the job's share lock and before the item's own row (a bundle is created
    before its job's photo items: a lower id), so of two items finishing at once the second waits
    here, sees the first's commit, and exactly one of them releases the bundle (``_bundle_ready``)."""
    ids = tuple(photo_ids)
    upto = bundle_reach(s, job_id, position - 1, ids, failed=failed) if ids else position
    bundle_id = _waiting_bundle(s, job_id, position, upto)
    if bundle_id is None:
        return None
    return s.execute(
        select(Item.id, Item.lane, Item.fencing_token, Item.position)
        .where(Item.id == bundle_id, Item.state == WAITING)
        .with_for_update()
    ).first()


def _bundle_ready(s: Session, job_id: int, bundle: Any, state: str) -> list[dict[str, Any]]:
    """A bundle item (several photos, locked by ``lock_bundle``) becomes ready (``state``) once
    every item of every lane before it has ended (the ending item's own row, and the later items it
    skipped or made ready, already written: a photo whose edit failed may still be on its way to
    a lane before the bundle). Its event row, for the caller to insert after the ending item's own."""
    if bundle is None:
        return []
    lanes = s.execute(select(Job.lanes).where(Job.id == job_id)).scalar_one()
    if any(lane_unfinished(s, job_id, lane) for lane in lanes[: bundle.position]):
        return []
    s.execute(update(Item).where(Item.id == bundle.id).values(state=state, updated_at=db_now()))
    return [
        {
            "type": "item_ready" if state == PENDING else f"item_{state}",
            "job_id": job_id,
            "item_id": bundle.id,
            "lane": bundle.lane,
            "token": bundle.fencing_token,
            "detail": {"state": state, "bundle": True},
        }
    ]


def bundle_members(engine: Engine, item_id: int) -> list[tuple[int, str]]:
    """(photo id, current path) of a bundle's photos whose items in the lanes the bundle's lane
    needs (:data:`NEEDS`) all succeeded (every photo when it needs none, the archive: a failed
    edit never keeps a photo out of its backup)."""
    with Session(reader(engine)) as s:
        bundle = s.get(Item, item_id)
        if bundle is None:
            return []
        lanes = s.execute(select(Job.lanes).where(Job.id == bundle.job_id)).scalar_one()
        q = (
            select(Photo.id, Photo.path)
            .join(ItemPhoto, ItemPhoto.photo_id == Photo.id)
            .where(ItemPhoto.item_id == item_id)
            .order_by(Photo.id)
        )
        for lane in sorted(needs(bundle.lane, lanes[: bundle.position])):
            done = select(Item.photo_id).where(
                Item.job_id == bundle.job_id, Item.lane == lane, Item.state == SUCCEEDED
            )
            q = q.where(Photo.id.in_(done))
        return [(r.id, r.path) for r in s.execute(q)]


def _mark_waiting(s: Session, rows: Sequence[Any], values: dict[str, Any]) -> list[Any]:
    """The still-waiting ones of ``rows`` (items) updated with ``values``; those updated (a
    concurrent cancel may have ended some already)."""
    changed: set[int] = set()
    for chunk in chunked([i.id for i in rows]):
        changed.update(
            s.execute(
                update(Item)
                .where(Item.id.in_(chunk), unindexed_state(WAITING))
                .values(**values, updated_at=db_now())
                .returning(Item.id)
            ).scalars()
        )
    return [i for i in rows if i.id in changed]


def advance(
    s: Session, job_id: int, position: int, photo_ids: Iterable[int], state: str, bundle: Any
) -> list[dict[str, Any]]:
    """Each photo's next waiting item (the next lane's; a later one where the lanes between were
    skipped by an earlier failure) becomes ready (``state``: pending, or paused/cancelled per the
    job), and the job's waiting bundle (locked by ``lock_bundle``) when every lane before it ended.
    Their event rows, for the caller to insert after the ending item's own event."""
    nxt = _runnable(s, job_id, position, _first_per_photo(_successors(s, job_id, position, photo_ids)))
    events = _ready_events(s, job_id, nxt, state)
    return _bundle_ready(s, job_id, bundle, state) + events


def _first_per_photo(items: Sequence[Any]) -> list[Any]:
    first: dict[int, Any] = {}
    for i in sorted(items, key=lambda i: i.position):
        first.setdefault(i.photo_id, i)
    return list(first.values())


def _ready_events(s: Session, job_id: int, items: Sequence[Any], state: str) -> list[dict[str, Any]]:
    if not items:
        return []
    return [
        {
            "type": "item_ready" if state == PENDING else f"item_{state}",
            "job_id": job_id,
            "item_id": i.id,
            "photo_id": i.photo_id,
            "lane": i.lane,
            "token": i.fencing_token,
            "detail": {"state": state},
        }
        for i in _mark_waiting(s, items, {"state": state})
    ]


def blocked_and_next(
    lanes: Sequence[str], failed_lane: str, later: Sequence[Any]
) -> tuple[list[Any], list[Any]]:
    """After a photo's item of ``failed_lane`` failed: which of its waiting ``later`` items are
    skipped (their lane needs the failed lane, or a lane skipped for it: :data:`NEEDS`) and which
    one runs next (the first that is not skipped), per photo."""
    skip: list[Any] = []
    ready: list[Any] = []
    by_photo: dict[Any, list[Any]] = {}
    for i in sorted(later, key=lambda i: i.position):
        by_photo.setdefault(i.photo_id, []).append(i)
    for items in by_photo.values():
        blocked = {failed_lane}
        found_next = False
        for i in items:
            if needs(i.lane, lanes[: i.position]) & blocked:
                skip.append(i)
                blocked.add(i.lane)
            elif not found_next:
                ready.append(i)
                found_next = True
    return skip, ready


def skip_later(
    s: Session, job_id: int, position: int, photo_ids: Iterable[int], reason: str, state: str, bundle: Any
) -> list[dict[str, Any]]:
    """After the photos' item at ``position`` failed for good: every later lane's waiting item that
    needs it (:data:`NEEDS`, directly or through a lane skipped for it) becomes ``skipped`` with the
    reason; the first later item that does not becomes ready (``state``: its ready state) — a
    failed edit never stops the photo's upload and archive —, and the job's waiting bundle goes on
    (without the photos, where it needs the lane) once every lane before it ended. Their event
    rows, for the caller to insert."""
    lanes = s.execute(select(Job.lanes).where(Job.id == job_id)).scalar_one()
    later = _successors(s, job_id, position, photo_ids)
    skip, ready = blocked_and_next(lanes, lanes[position], later)
    ready = _runnable(s, job_id, position, ready)
    lock_items(s, [i.id for i in (*skip, *ready)])  # ascending id, whichever is skipped or made ready
    events = [
        {
            "type": "item_skipped",
            "job_id": job_id,
            "item_id": i.id,
            "photo_id": i.photo_id,
            "lane": i.lane,
            "token": i.fencing_token,
            "detail": {"reason": reason},
        }
        for i in _mark_waiting(s, skip, {"state": SKIPPED, "error": reason})
    ]
    events += _ready_events(s, job_id, ready, state)
    return _bundle_ready(s, job_id, bundle, state) + events


def skip_successors(s: Session, job_id: int, position: int, photo_ids: Iterable[int], reason: str) -> None:
    """Every later lane's item of the photo becomes ``skipped`` with the reason (a bundle goes on
    without the photo), with their events. Lock order: the job (share), then these items; a
    transaction that dropped photo-lock rows before calling this locked them first
    (``lock_successors``)."""
    state = ready_state(s, job_id)  # the job before any successor row (lock order)
    bundle = lock_bundle(s, job_id, position + 1, photo_ids, failed=True)
    emit_many(s, skip_later(s, job_id, position, photo_ids, reason, state, bundle))


def lock_items(s: Session, item_ids: Iterable[int]) -> None:
    """Row-lock the items, in ascending id."""
    for chunk in chunked(sorted(set(item_ids))):
        s.execute(select(Item.id).where(Item.id.in_(chunk)).order_by(Item.id).with_for_update()).all()


def successor_ids(s: Session, finishing: Iterable[tuple[int, int, Iterable[int]]]) -> set[int]:
    """The rows that ending the items ``finishing`` ((job id, position, photo ids) each) may move
    on: the waiting bundle of the next position, and the waiting items of later lanes of their
    photos."""
    groups: dict[tuple[int, int], set[int]] = {}
    for job_id, position, photo_ids in finishing:
        groups.setdefault((job_id, position), set()).update(photo_ids)
    ids: set[int] = set()
    for (job_id, position), photos in sorted(groups.items()):
        upto = bundle_reach(s, job_id, position, sorted(photos), failed=True) if photos else position + 1
        bundle_id = _waiting_bundle(s, job_id, position + 1, upto)
        if bundle_id is not None:
            ids.add(bundle_id)
        ids.update(row.id for row in _successors(s, job_id, position, sorted(photos)))
    return ids


def lock_successors(s: Session, item_ids: Sequence[int]) -> None:
    """PostgreSQL: row-lock, in ascending id, what ending the items ``item_ids`` may move on (the
    next lane's waiting bundle, the later lanes' waiting items of their photos: ``skip_successors``):
    a transaction that ends several items and releases their photo locks (the sweeper's
    revocation) takes these rows before its first photo-lock row, as the global order asks (a later
    UPDATE of a row locked here waits for nobody). Called before the items themselves are locked
    (the sweeper locks them ``SKIP LOCKED``): a finish of one of them holds the bundle before its own
    row (``lock_bundle``), so waiting here for the bundle while holding the item would deadlock with
    it. The caller holds the jobs' share locks."""
    if s.get_bind().dialect.name != "postgresql" or not item_ids:
        return
    finishing: list[tuple[int, int, list[int]]] = []
    for chunk in chunked(sorted(set(item_ids))):
        rows = s.execute(select(Item.job_id, Item.position, Item.photo_id).where(Item.id.in_(chunk))).all()
        finishing += [(r.job_id, r.position, [r.photo_id] if r.photo_id is not None else []) for r in rows]
    lock_items(s, successor_ids(s, finishing))
