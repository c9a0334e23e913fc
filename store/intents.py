"""File-effect intents (exactly-once file effects, docs/design.md rule 9) and the photo facts they use.

An intent says "move ``staged`` to ``target``; the target held ``base_sha256`` when this was
planned and will hold ``result_sha256``". It is recorded in a fenced transaction *before* the file
operation, applied with one atomic operation, then marked ``applied`` (or ``discarded``) in another
fenced transaction. A recovering attempt of the same item finishes or discards the intents its
predecessors left ``recorded``; intents of items that stopped are settled by the sweeper
(:func:`settle_orphans`), deciding from the disk (``photos.recovery``).

While an intent is ``recorded`` its item's photo locks stay held, by the intent once the item's
lease ends (``photo_locks.intent_id``); settling the item's last intent releases them.
Lock order (every path): job -> item -> photo -> intent -> photo lock rows.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, delete, exists, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from photos import fileops, recovery
from photos.errors import OutsideRoot
from photos.params import job_roots
from photos.rootfs import Roots

from . import history
from .clock import db_now
from .engine import reader
from .events import emit_for
from .fencing import defer_write, lock_fence
from .leases import Lease
from .models import (
    CANCELLED,
    FAILED,
    PAUSED,
    RUNNING,
    SKIPPED,
    SUCCEEDED,
    Intent,
    Item,
    Job,
    Photo,
    PhotoLock,
)
from .photo_locks import lock_photo_rows
from .queries import photo_hash_sql

log = logging.getLogger("photojobs.intents")

RECORDED = "recorded"
APPLIED = "applied"
DISCARDED = "discarded"


@dataclass(frozen=True)
class IntentRow:
    id: int
    item_id: int
    token: int
    photo_id: int | None
    kind: str
    staged: str
    target: str
    source: str | None
    base_sha256: str | None
    result_sha256: str | None
    state: str

    @property
    def sha256(self) -> str | None:
        """The content the effect produces (the column was ``sha256`` before revision 0002)."""
        return self.result_sha256

    def effect(self) -> recovery.Effect:
        return recovery.Effect(
            self.kind, self.staged, self.target, self.source, self.base_sha256, self.result_sha256
        )


def _row(i: Intent) -> IntentRow:
    return IntentRow(
        i.id,
        i.item_id,
        i.token,
        i.photo_id,
        i.kind,
        i.staged,
        i.target,
        i.source,
        i.base_sha256,
        i.result_sha256,
        i.state,
    )


def lock_item(s: Session, item_id: int) -> None:
    """Row-lock the item first, so a transaction that also touches photos and intents takes its
    locks in the global order (job -> item -> photo -> intent)."""
    s.execute(select(Item.id).where(Item.id == item_id).with_for_update()).all()


class TargetTaken(Exception):  # noqa: N818
    """Another live intent already claims this target path."""


def record(
    s: Session,
    lease: Lease,
    *,
    kind: str,
    staged: str,
    target: str,
    source: str | None,
    sha256: str | None,
    worker: str | None,
    base_sha256: str | None = None,
    companion: bool = False,
    detail: dict[str, Any] | None = None,
) -> int:
    """Record an intent in the caller's fenced session; ``TargetTaken`` if another live intent
    already names the target (the unique index on live targets decides). ``sha256`` is the
    content the effect produces, ``base_sha256`` the content the target has now (None: new name).
    A ``companion`` intent moves or writes a file that travels with the photo (a raw's XMP
    sidecar): it names no photo, so settling it never moves the photo's row. ``detail`` is what the
    effect log needs once it is applied (``store.history``)."""
    lock_item(s, lease.item_id)
    photo_id = None if companion else lease.photo_id
    if kind == "move" and _named_by_another_photo(s, target, lease.photo_id):
        # a photo whose file just left this name (moved, its mark not yet committed) still names it:
        # a move here now could not move this photo's row after its file (``_follow_photo``), and
        # its next lane would not find it ("file not found"); the name is taken until that row moves
        raise TargetTaken(target)
    try:
        with s.begin_nested():
            intent_id = s.execute(
                insert(Intent)
                .values(
                    item_id=lease.item_id,
                    token=lease.token,
                    photo_id=photo_id,
                    kind=kind,
                    staged=staged,
                    target=target,
                    source=source,
                    base_sha256=base_sha256,
                    result_sha256=sha256,
                    state=RECORDED,
                    created_at=db_now(),
                    detail=detail,
                )
                .returning(Intent.id)
            ).scalar_one()
    except IntegrityError as exc:  # the unique index on live targets
        raise TargetTaken(target) from exc
    emit_for(
        s,
        "intent_recorded",
        lease,
        worker,
        {"intent": intent_id, "kind": kind, "target": target, "staged": staged},
    )
    return intent_id


def _named_by_another_photo(s: Session, path: str, photo_id: int | None) -> bool:
    """Another photo's row names ``path`` (``photos.path`` is unique: through its index)."""
    q = select(Photo.id).where(Photo.path == path)
    if photo_id is not None:
        q = q.where(Photo.id != photo_id)
    return s.execute(q.limit(1)).first() is not None


def settle(
    s: Session,
    lease: Lease,
    intent_id: int,
    state: str,
    *,
    worker: str | None,
    photo_path: str | None = None,
    photo_sha256: str | None = None,
    note: str | None = None,
) -> None:
    """Mark an intent applied/discarded (fenced session); an applied move also moves the photo's path.

    Locks: the item, then the photo, then the intent (the global order)."""
    lock_item(s, lease.item_id)
    values: dict[str, Any] = {}
    if photo_path is not None:
        values["path"] = photo_path
    if photo_sha256 is not None:
        values["sha256"] = photo_sha256
    if values and lease.photo_id is not None and not _follow_photo(s, lease.photo_id, values):
        note = f"{note or state}; {_NAMED_ELSEWHERE.format(path=photo_path)}"
        photo_path = None
    done = s.execute(
        update(Intent).where(Intent.id == intent_id, Intent.state == RECORDED).values(state=state)
    ).rowcount
    if done and state == APPLIED:
        history.log_applied(
            s, intent_id, job_id=lease.job_id, item_id=lease.item_id, lane=lease.lane, photo_id=lease.photo_id
        )
    emit_for(
        s,
        f"intent_{state}",
        lease,
        worker,
        {
            "intent": intent_id,
            **({"note": note} if note else {}),
            **({"path": photo_path} if photo_path else {}),
        },
    )


def open_intents(engine: Engine, item_id: int) -> list[IntentRow]:
    """Intents of this item still ``recorded`` (left by earlier attempts, or this one)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Intent).where(Intent.item_id == item_id, Intent.state == RECORDED).order_by(Intent.id)
        ).scalars()
        return [_row(r) for r in rows]


def item_intents(engine: Engine, item_id: int) -> list[IntentRow]:
    with Session(reader(engine)) as s:
        return [
            _row(r)
            for r in s.execute(select(Intent).where(Intent.item_id == item_id).order_by(Intent.id)).scalars()
        ]


def live_staged_paths(engine: Engine) -> set[str]:
    with Session(reader(engine)) as s:
        return set(s.execute(select(Intent.staged).where(Intent.state == RECORDED)).scalars())


def photo_facts(engine: Engine, job_id: int, photo_id: int | None) -> dict[str, Any] | None:
    """The photo's analysis facts: this job's analysis item if it has one, else the newest from any job;
    plus ``file_time``, the file's modification time recorded at submission, when known."""
    if photo_id is None:
        return None
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(Item.job_id, Item.result)
            .where(Item.photo_id == photo_id, Item.lane == "analysis", Item.state == SUCCEEDED)
            .order_by(Item.id.desc())
        ).all()
        file_time = s.execute(select(Photo.file_time).where(Photo.id == photo_id)).scalar()
    facts = next((dict(result) for job, result in rows if job == job_id and result), None)
    if facts is None and rows and rows[0].result:
        facts = dict(rows[0].result)
    if file_time is not None:
        facts = {**(facts or {}), "file_time": file_time}
    return facts


def set_photo_hash(s: Session, photo_id: int, sha256: str, size: int | None) -> None:
    """Record the photo's content hash and size (in the analysis item's final commit). In a fenced
    session whose fence is not checked yet (no finishing compare-and-set before it), the fence is
    checked first (``lock_fence``): the item's row lock before the photo's. In a batch finish the
    row is written with the other items' by one statement before the commit."""
    lock_fence(s)
    row = {"photo_id": photo_id, "sha256": sha256, "size": size}
    if defer_write(s, PHOTO_HASHES, 1, _set_photo_hashes):  # a batch finish: with its other items'
        s.info.setdefault(PHOTO_HASHES, []).append(row)
        return
    conn = s.connection()
    conn.execute(photo_hash_sql(conn.dialect.name), row)


PHOTO_HASHES = "photo_hashes"  # session.info: a batch finish's photo hashes, written at its end


def _set_photo_hashes(s: Session) -> None:
    """A batch finish's ``set_photo_hash`` rows in one statement, in ascending photo id (the lock
    order; a photo's later row last, as one after another)."""
    rows = sorted(s.info.pop(PHOTO_HASHES, []), key=lambda r: r["photo_id"])
    if rows:
        conn = s.connection()
        conn.execute(photo_hash_sql(conn.dialect.name), rows)


class IntentSettled(Exception):  # noqa: N818
    """The intent is no longer ``recorded``: someone else settled it; do not apply it."""


def assert_live(s: Session, lease: Lease, intent_id: int) -> None:
    """The fenced check right before a file operation: the item (locked first) and the intent
    must still be live; the session's commit then checks the lease itself."""
    lock_item(s, lease.item_id)
    state = s.execute(select(Intent.state).where(Intent.id == intent_id)).scalar_one_or_none()
    if state != RECORDED:
        raise IntentSettled(f"intent {intent_id} is {state or 'gone'}; not applying it")


# Items in these states have no worker that will come back for their intents.
STOPPED = (PAUSED, CANCELLED, FAILED, SKIPPED, SUCCEEDED)


def settle_orphans(engine: Engine, limit: int = 100) -> int:
    """Settle the recorded intents of items that stopped (paused, cancelled, failed, …), deciding
    from the disk without applying anything: result on disk -> applied (the photo moves with it),
    otherwise discarded and the staged file removed. Then release the photo locks those intents
    held, and any lock left by an item that is neither running nor owns a live intent.

    One transaction per item (:func:`_settle_item`), in the global lock order: the item row-locked
    first (``SKIP LOCKED``: a claim of the same item — a resume — is left alone and then recovers
    whatever is left), then the photos its intents name in ascending id, then its intents, then its
    photo-lock rows. (One transaction over several items took the next item's photo after the
    previous item's photo-lock rows, photos in item order: a bundle claim locking the same photos
    in ascending id could deadlock with it.) Returns how many intents were settled.
    """
    with Session(engine) as s:
        item_ids = list(
            s.execute(
                select(Item.id)
                .where(
                    Item.id.in_(select(Intent.item_id).where(Intent.state == RECORDED)),
                    Item.state.in_(STOPPED),
                )
                .order_by(Item.id)
                .limit(limit)
            ).scalars()
        )
    settled = 0
    for item_id in item_ids:
        with Session(engine) as s, s.begin():
            settled += _settle_item(s, item_id)
    with Session(engine) as s, s.begin():
        # Locks no lease and no live intent owns (e.g. left by an older version): release them.
        s.execute(
            delete(PhotoLock).where(
                ~exists().where(Item.id == PhotoLock.item_id, Item.state == RUNNING),
                ~exists().where(Intent.item_id == PhotoLock.item_id, Intent.state == RECORDED),
            )
        )
    return settled


def _settle_item(s: Session, item_id: int) -> int:
    """Settle one stopped item's recorded intents (see ``settle_orphans``) in the caller's
    transaction; how many were settled (0 when the item is locked by someone else or moved on)."""
    item = s.execute(
        select(Item).where(Item.id == item_id, Item.state.in_(STOPPED)).with_for_update(skip_locked=True)
    ).scalar_one_or_none()
    if item is None:
        return 0
    rows = [
        _row(i)
        for i in s.execute(
            select(Intent).where(Intent.item_id == item_id, Intent.state == RECORDED).order_by(Intent.id)
        ).scalars()
    ]
    photos = sorted({r.photo_id for r in rows if r.photo_id is not None and r.kind in ("move", "replace")})
    if photos and s.get_bind().dialect.name == "postgresql":
        lock_photo_rows(s.connection(), photos)  # before any write: photos in ascending id
    # A photo and its sidecars move, upload or are edited as one unit: once the photo's effect
    # landed, the sidecars' recorded ones are finished too (both or neither), never discarded (the
    # photo's effect is applied first: actors.exif, actors.moves).
    landed = _photo_landed(s, item_id)
    job = s.get(Job, item.job_id)
    within = Roots(job_roots(job.roots or [], job.params or {}) if job is not None else [])
    settled = 0
    for row in rows:
        try:
            verdict = recovery.settle_on_disk(
                row.effect(), may_apply=landed and row.photo_id is None, tag=f"sweep{row.id}", within=within
            )
        except OSError as exc:
            log.warning("cannot settle intent %s yet: %s", row.id, exc)
            continue
        settled += _settle_stopped(s, item, row, verdict)
        photos_own = row.kind in UNIT_LEADS and row.photo_id is not None
        landed = landed or (photos_own and verdict.settles_as == APPLIED)
    _release_if_settled(s, item_id)
    return settled


UNIT_LEADS = ("move", "publish", "replace")  # a photo's own effect, which its sidecars' follow


def _photo_landed(s: Session, item_id: int) -> bool:
    """True when the item already moved, published or edited its photo: an applied intent naming it."""
    return (
        s.execute(
            select(Intent.id)
            .where(
                Intent.item_id == item_id,
                Intent.state == APPLIED,
                Intent.kind.in_(UNIT_LEADS),
                Intent.photo_id.is_not(None),
            )
            .limit(1)
        ).scalar_one_or_none()
        is not None
    )


def _follow_photo(s: Session, photo_id: int, values: dict[str, Any]) -> bool:
    """Move the photo's row to where its file is (``values``: path and/or sha256). False, and the
    row left as it was, when another photo row already names that path (``photos.path`` is
    unique): one stuck row must not fail the transaction (the sweeper's would fail every pass)."""
    try:
        with s.begin_nested():
            s.execute(update(Photo).where(Photo.id == photo_id).values(**values, updated_at=db_now()))
    except IntegrityError:
        log.warning("photo %s cannot follow its file to %s: another photo row names it", photo_id, values)
        return False
    return True


_NAMED_ELSEWHERE = "photo row not moved: another photo row already names {path}"


def _settle_stopped(s: Session, item: Item, row: IntentRow, verdict: recovery.Verdict) -> int:
    """Settle one intent of a stopped item as the disk says; an applied move or replace (also a
    move that landed and was changed afterwards: ``verdict.moved``) moves the photo's row with it."""
    state = verdict.settles_as
    moved = state == APPLIED and row.photo_id is not None and row.kind in ("move", "replace")
    note = verdict.note
    if moved:
        values: dict[str, Any] = {"sha256": verdict.content or row.result_sha256}
        if row.kind == "move":
            values["path"] = row.target
        if not _follow_photo(s, row.photo_id, values):  # type: ignore[arg-type]
            note = f"{note}; {_NAMED_ELSEWHERE.format(path=row.target)}"
            moved = False
    done = s.execute(
        update(Intent).where(Intent.id == row.id, Intent.state == RECORDED).values(state=state)
    ).rowcount
    if done and state == APPLIED:
        history.log_applied(
            s, row.id, job_id=item.job_id, item_id=item.id, lane=item.lane, photo_id=item.photo_id
        )
    emit_for(
        s,
        f"intent_{state}",
        item,
        "sweeper",
        {
            "intent": row.id,
            "note": f"item {item.state}: {note}",
            **({"path": row.target} if moved and row.kind == "move" else {}),
        },
        photo_id=row.photo_id,
    )
    return done


def _release_if_settled(s: Session, item_id: int) -> None:
    live = s.execute(
        select(Intent.id).where(Intent.item_id == item_id, Intent.state == RECORDED).limit(1)
    ).scalar_one_or_none()
    if live is None:
        s.execute(delete(PhotoLock).where(PhotoLock.item_id == item_id))


def stray_roots(engine: Engine) -> list[Path]:
    """Folders where staged files may be: every job's roots, archive roots and local upload targets."""
    with Session(reader(engine)) as s:
        rows = s.execute(select(Job.roots, Job.params)).all()
    found: dict[Path, None] = {}
    for roots, params in rows:
        for r in job_roots(roots or [], params or {}):
            found[r] = None
    return [p for p in found if p.is_dir()]


def sweep_stray_staged(engine: Engine, grace: float, roots: Iterable[Path] | None = None) -> list[Path]:
    """Remove staged files (our ``.{name}.pj-{tag}.tmp`` pattern only) under the jobs' roots that
    no live intent owns and that are older than ``grace`` seconds (an attempt may be writing one
    it has not recorded yet)."""
    live = live_staged_paths(engine)
    now = time.time()

    def keep(path: Path) -> bool:
        # A staged move is a hard link to the photo and carries the photo's old mtime: its ctime
        # (changed by the link and by every rename) says when it was made or claimed.
        try:
            return str(path) in live or now - os.lstat(path).st_ctime <= grace
        except FileNotFoundError:
            return True

    removed: list[Path] = []
    for root in roots if roots is not None else stray_roots(engine):
        try:
            removed += fileops.sweep_stray_temps(root, grace, keep, now=now)
        except (OSError, OutsideRoot) as exc:  # a root gone, or swapped for a symlink: not walked
            log.warning("staged files under %s not swept: %s", root, exc)
    return removed
