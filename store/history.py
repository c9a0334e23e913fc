"""The effect log: every file effect a job applied to a photo, for per-photo history and undo.

One row of ``photo_effects`` per applied intent, written by :func:`log_applied` in the transaction
that marks the intent ``applied`` (``store.intents``: a worker's fenced mark, a recovering attempt,
the sweeper settling a stopped item's intent) — the one place rows are written, so the log holds
exactly the effects that happened. What only the worker knew when it recorded the intent (the tags
a metadata edit changes, where the displaced original is kept, which effect an undo reverses) comes
from the intent's ``detail``. A row an undo reversed gets ``undone_by`` (the undo job) in that same
transaction; undoing the undo clears it again (the original effect is back: a redo).

A remote upload (S3) is no intent: :func:`log_remote` writes its row (``effect`` ``remote``, the
object's identity in ``remote``) in the fenced transaction that marks the upload item succeeded
(``ItemContext.at_finish``), and the row of an undo that deleted the remote copy in the undo item's.

Lock order: this table comes last (after photo_locks); rows are updated by id only.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, and_, insert, or_, select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .errors import UnknownJob
from .models import Intent, Item, Job, Photo, PhotoEffect

# What an effect is called in the history, by lane (an undo effect names its own kind in ``detail``).
KIND_BY_LANE = {"exif": "metadata edit", "rename": "rename", "archive": "archive", "upload": "upload"}
# Params of an undo job (``photojobs undo``): the job it undoes, and whether uploads are removed.
UNDO_JOB = "undo.job"
UNDO_UPLOADS = "undo.uploads"
UNDO_LANES = "undo.lanes"
# An intent's detail: the folders a move or publish made (deepest first), removed by its undo if empty.
MADE_DIRS = "made_dirs"
# Why an archive bundle is not undone (the planner's note, and the refusal of a bundle item).
BUNDLE_STAYS = (
    "an archive bundle is a copy and is not undone: the originals never moved, and an undo never "
    "deletes a backup (remove the bundle by hand if it is not wanted)"
)
# The lanes an undo may reverse: those that change files (analysis changes none).
UNDOABLE = ("exif", "rename", "archive", "upload")


@dataclass(frozen=True)
class Effect:
    id: int
    photo_id: int | None
    job_id: int
    item_id: int
    intent_id: int | None
    lane: str
    kind: str
    effect: str
    sidecar: bool
    from_path: str | None
    to_path: str
    before_sha256: str | None
    after_sha256: str | None
    changes: dict[str, Any] | None
    kept: str | None
    undoes: int | None
    undone_by: int | None
    at: float
    remote: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "effect": self.id,
            "job": self.job_id,
            "lane": self.lane,
            "when": self.at,
            "kind": self.kind,
            "sidecar": self.sidecar,
            "from_path": self.from_path,
            "to_path": self.to_path,
            "before_sha256": self.before_sha256,
            "after_sha256": self.after_sha256,
            **({"changes": self.changes} if self.changes is not None else {}),
            **({"undoes": self.undoes} if self.undoes is not None else {}),
            "original_kept": self.kept is not None if self.effect == "replace" else None,
            **(
                {
                    "target": self.remote.get("target"),
                    "key": self.remote.get("key"),
                    "etag": self.remote.get("etag"),
                    "created": self.remote.get("created"),
                }
                if self.remote is not None
                else {}
            ),  # fmt: skip
            "undone_by": self.undone_by,
        }


def _effect(r: PhotoEffect) -> Effect:
    return Effect(
        r.id, r.photo_id, r.job_id, r.item_id, r.intent_id, r.lane, r.kind, r.effect, bool(r.sidecar),
        r.from_path, r.to_path, r.before_sha256, r.after_sha256, r.changes, r.kept, r.undoes,
        r.undone_by, r.at, r.remote,
    )  # fmt: skip


def log_applied(
    s: Session, intent_id: int, *, job_id: int, item_id: int, lane: str, photo_id: int | None
) -> None:
    """Write the effect row of an intent just marked applied, in the caller's transaction (the
    one that marks it), and link an undo to the effect it reversed. Idempotent per intent."""
    i = s.execute(select(Intent).where(Intent.id == intent_id)).scalar_one_or_none()
    if i is None or s.execute(select(PhotoEffect.id).where(PhotoEffect.intent_id == intent_id)).first():
        return
    detail = dict(i.detail or {})
    undoes = detail.get("undoes")
    from_path = i.source if i.kind in ("move", "publish") else i.target
    s.execute(
        insert(PhotoEffect).values(
            photo_id=photo_id,
            job_id=job_id,
            item_id=item_id,
            intent_id=intent_id,
            lane=lane,
            kind=str(detail.get("kind") or KIND_BY_LANE.get(lane, lane)),
            effect=i.kind,
            sidecar=bool(detail.get("sidecar", i.photo_id is None and photo_id is not None)),
            from_path=from_path,
            to_path=i.target,
            before_sha256=i.base_sha256,
            after_sha256=i.result_sha256,
            changes=detail.get("changes"),
            kept=detail.get("kept"),
            undoes=undoes,
            undone_by=None,
            at=db_now(),
        )
    )
    if undoes is not None:
        _link_undo(s, undoes, job_id)


def _link_undo(s: Session, undoes: int, job_id: int) -> None:
    """The effect ``undoes`` was reversed by ``job_id``, and the chain behind it follows: an undo of
    an undo is a redo (the effect the undone one had reversed is in effect again), an undo of that
    redo undoes it again, and so on down the chain (``undone_by`` alternates: set, cleared, set …)."""
    target: int | None = undoes
    by: int | None = job_id
    seen: set[int] = set()
    while target is not None and target not in seen:
        seen.add(target)
        s.execute(update(PhotoEffect).where(PhotoEffect.id == target).values(undone_by=by))
        row = s.execute(
            select(PhotoEffect.undoes, PhotoEffect.job_id).where(PhotoEffect.id == target)
        ).one_or_none()
        if row is None:
            break
        # ``target`` is out of effect now: what it had reversed is back; in effect: reversed again
        target, by = row.undoes, (None if by is not None else row.job_id)


def in_the_way(later: Iterable[Effect], after: int) -> list[Effect]:
    """The chain rule: of the effects on a photo logged after effect ``after`` and still in effect
    (:func:`later_effects`), those that really changed it since. An undo that reverses an effect
    itself later than ``after`` cancels that effect (the pair put the photo back to where ``after``
    left it), so it is no later change: undo B then undo A works, and the advice to undo a change
    in the way never names an undo that would re-apply what was just undone."""
    return [e for e in later if not (e.undoes is not None and e.undoes > after)]


@dataclass(frozen=True)
class RemoteEffect:
    """One remote object an item uploaded (``undoes`` None) or deleted in an undo."""

    photo_id: int | None
    kind: str  # "upload", "upload removed", "upload left in place"
    from_path: str | None  # the local file uploaded
    location: str  # s3://bucket/key
    sha256: str | None
    remote: dict[str, Any]  # target, bucket, key, etag, size, created
    sidecar: bool = False
    undoes: int | None = None


def log_remote(s: Session, *, job_id: int, item_id: int, effects: Iterable[RemoteEffect]) -> None:
    """Write the effect rows of an item's remote objects (an S3 upload, or an undo's deletion of
    one), in the caller's transaction: the fenced one that marks the item succeeded, so they are
    logged exactly once, whoever's attempt succeeds. Idempotent per (item, location)."""
    for e in effects:
        if s.execute(
            select(PhotoEffect.id).where(  # through ix_photo_effects_job (job, lane)
                PhotoEffect.job_id == job_id,
                PhotoEffect.lane == "upload",
                PhotoEffect.item_id == item_id,
                PhotoEffect.to_path == e.location,
                PhotoEffect.intent_id.is_(None),
            )
        ).first():
            continue
        s.execute(
            insert(PhotoEffect).values(
                photo_id=e.photo_id, job_id=job_id, item_id=item_id, intent_id=None, lane="upload",
                kind=e.kind, effect="remote", sidecar=e.sidecar, from_path=e.from_path,
                to_path=e.location, before_sha256=None if e.undoes is None else e.sha256,
                after_sha256=e.sha256 if e.undoes is None else None, changes=None, kept=None,
                undoes=e.undoes, undone_by=None, at=db_now(), remote=dict(e.remote),
            )
        )  # fmt: skip
        if e.undoes is not None:
            _link_undo(s, e.undoes, job_id)


# -- reading --------------------------------------------------------------------------------------
def find_photo(engine: Engine, path: str) -> int | None:
    """The photo whose current path is ``path``; else the newest photo an effect moved away from it."""
    with Session(reader(engine)) as s:
        pid = s.execute(select(Photo.id).where(Photo.path == path)).scalar_one_or_none()
        if pid is None:
            pid = s.execute(
                select(PhotoEffect.photo_id)
                .where(
                    or_(PhotoEffect.from_path == path, PhotoEffect.to_path == path),
                    PhotoEffect.sidecar.is_(False),
                )
                .order_by(PhotoEffect.id.desc())
                .limit(1)
            ).scalar_one_or_none()
        return pid


#: A page of a photo's history: ``limit`` entries by default, at most ``HISTORY_MAX_PAGE``.
HISTORY_PAGE = 100
HISTORY_MAX_PAGE = 1000


def photo_history(
    engine: Engine, photo_id: int, *, limit: int = HISTORY_PAGE, after: int | None = None
) -> dict[str, Any] | None:
    """``{"photo": id, "path": current path, "history": [entry, …], "next": effect id | None}``:
    at most ``limit`` entries, oldest first, those logged after effect ``after``; ``next`` is the
    ``after`` of the following page (None on the last). None for an unknown photo."""
    if not 1 <= limit <= HISTORY_MAX_PAGE:
        raise ValueError(f"limit {limit} must be between 1 and {HISTORY_MAX_PAGE}")
    with Session(reader(engine)) as s:
        path = s.execute(select(Photo.path).where(Photo.id == photo_id)).scalar_one_or_none()
        if path is None:
            return None
        q = select(PhotoEffect).where(PhotoEffect.photo_id == photo_id)
        if after is not None:
            q = q.where(PhotoEffect.id > after)
        rows = list(s.execute(q.order_by(PhotoEffect.id).limit(limit + 1)).scalars())
        more = len(rows) > limit
        page = [_effect(r).as_dict() for r in rows[:limit]]
        undone = sorted({e["undoes"] for e in page if e.get("undoes") is not None})
        jobs = dict(
            s.execute(select(PhotoEffect.id, PhotoEffect.job_id).where(PhotoEffect.id.in_(undone))).all()
        ) if undone else {}  # fmt: skip
        for e in page:  # an undo's entry names the job it undid (``history``: "undo of job N")
            if e.get("undoes") is not None:
                e["undoes_job"] = jobs.get(e["undoes"])
        nxt = page[-1]["effect"] if more else None
        return {"photo": photo_id, "path": path, "history": page, "next": nxt}


def effects_of(
    engine: Engine, job_id: int, *, lane: str | None = None, photo_id: int | None = None
) -> list[Effect]:
    """The effects a job applied (oldest first), optionally of one lane and photo."""
    q = select(PhotoEffect).where(PhotoEffect.job_id == job_id)
    if lane is not None:
        q = q.where(PhotoEffect.lane == lane)
    if photo_id is not None:
        q = q.where(PhotoEffect.photo_id == photo_id)
    with Session(reader(engine)) as s:
        return [_effect(r) for r in s.execute(q.order_by(PhotoEffect.id)).scalars()]


def later_effects(engine: Engine, photo_id: int, after: int) -> list[Effect]:
    """Effects on the photo logged after effect ``after`` and not undone (oldest first)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(PhotoEffect)
            .where(PhotoEffect.photo_id == photo_id, PhotoEffect.id > after, PhotoEffect.undone_by.is_(None))
            .order_by(PhotoEffect.id)
        ).scalars()
        return [_effect(r) for r in rows]


def later_at(engine: Engine, location: str, after: int) -> list[Effect]:
    """Effects on the same remote object (``to_path``) logged after effect ``after``, not undone:
    a later job that uploaded the same key, whatever photo it came from (oldest first)."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(PhotoEffect)
            .where(PhotoEffect.id > after, PhotoEffect.to_path == location, PhotoEffect.undone_by.is_(None))
            .order_by(PhotoEffect.id)
        ).scalars()
        return [_effect(r) for r in rows]


#: An item in one of these states will not move its photo any more.
_ENDED = ("succeeded", "failed", "skipped", "cancelled")


def leaving_occupant(engine: Engine, undo_job: int, undone_job: int, path: str, photo_id: int) -> int | None:
    """The photo (not ``photo_id``) that holds ``path`` now — its row names it, or one of its
    sidecars an effect of ``undone_job`` put there — and whose undo in ``undo_job`` has not ended:
    it will move away from ``path`` (undoing in reverse order: a name freed and taken again within
    the undone job is free again once the later taker's undo has run). None when there is none."""
    with Session(reader(engine)) as s:
        # The recorded intents first, the rows after: each statement sees what had committed when it
        # began (PostgreSQL, read committed), and a move's settle turns its intent ``applied`` and
        # moves its photo's row in one commit. Rows first, a settle committing between the two looks
        # hid the photo from both (seen: "its old path is taken by another file" in a burst's undo
        # on two workers); in this order the photo is seen recorded, or at the path, or both.
        held = set(  # an undo of this job moving a photo there now (recorded, not yet applied)
            s.execute(
                select(Item.photo_id)
                .join(Intent, Intent.item_id == Item.id)
                .where(Intent.target == path, Intent.state == "recorded", Item.job_id == undo_job)
            ).scalars()
        )
        held |= set(s.execute(select(Photo.id).where(Photo.path == path)).scalars())
        held |= set(
            s.execute(
                select(PhotoEffect.photo_id).where(  # through ix_photo_effects_job
                    PhotoEffect.job_id == undone_job,
                    PhotoEffect.to_path == path,
                    PhotoEffect.sidecar.is_(True),
                    PhotoEffect.undone_by.is_(None),
                )
            ).scalars()
        )
        held -= {photo_id, None}
        if not held:
            return None
        found = s.execute(
            select(Item.photo_id)
            .where(Item.job_id == undo_job, Item.photo_id.in_(sorted(held)), Item.state.not_in(_ENDED))
            .limit(1)
        ).scalar_one_or_none()
        return found


def name_held(engine: Engine, path: str) -> bool:
    """Whether a photo's row names ``path`` or a recorded intent (a move or write not yet settled)
    targets it: the name is not free, whatever the disk says."""
    with Session(reader(engine)) as s:
        recorded = select(Intent.id).where(Intent.target == path, Intent.state == "recorded").limit(1)
        if s.execute(recorded).first():
            return True
        return s.execute(select(Photo.id).where(Photo.path == path).limit(1)).first() is not None


def freed_by_undo(engine: Engine, undone_job: int, path: str, photo_id: int) -> bool:
    """Whether an undo of ``undone_job`` moves the file now at ``path`` away: an effect of that job
    in effect moved another photo (or a sidecar) there (a dry run's view of :func:`leaving_occupant`:
    the undo goes in the exact reverse order, so the name is free again when this photo's turn comes)."""
    with Session(reader(engine)) as s:
        return (
            s.execute(
                select(PhotoEffect.id)
                .where(  # through ix_photo_effects_job
                    PhotoEffect.job_id == undone_job,
                    PhotoEffect.to_path == path,
                    PhotoEffect.effect == "move",
                    PhotoEffect.undone_by.is_(None),
                    or_(PhotoEffect.photo_id != photo_id, PhotoEffect.sidecar.is_(True)),
                )
                .limit(1)
            ).first()
            is not None
        )


def made_dirs(engine: Engine, effect: Effect) -> list[str] | None:
    """The folders ``effect``'s move or publish made (deepest first), from its intent's detail; None
    when it does not say (an effect logged before this was recorded, or its intent is gone)."""
    if effect.intent_id is None:
        return None
    with Session(reader(engine)) as s:
        detail = s.execute(select(Intent.detail).where(Intent.id == effect.intent_id)).scalar_one_or_none()
    made = detail.get(MADE_DIRS) if isinstance(detail, dict) else None
    return [str(d) for d in made] if isinstance(made, list) else None


def effect_by_id(engine: Engine, effect_id: int) -> Effect | None:
    with Session(reader(engine)) as s:
        r = s.get(PhotoEffect, effect_id)
        return _effect(r) if r is not None else None


# -- planning an undo -----------------------------------------------------------------------------
@dataclass(frozen=True)
class UndoPlan:
    job_id: int
    lanes: list[str]  # the undo job's lanes: the undone job's, reversed
    paths: list[str]  # the photos' current paths
    params: dict[str, Any]
    roots: list[str]
    note: str | None = None  # why there is nothing to undo, or what an undo leaves (a bundle)
    photo_ids: list[int] = field(default_factory=list)  # the photos of ``paths``, in their order


class NothingToUndo(Exception):  # noqa: N818 - an answer, not a failure
    pass


class NotInJob(ValueError):
    """``undo --photo PATH`` named a path that is no photo of the job (by its current path)."""

    def __init__(self, job_id: int, paths: list[str]) -> None:
        self.job_id, self.paths = job_id, paths
        super().__init__(f"not a photo of job {job_id} (give its current path): {', '.join(paths)}")


def plan_undo(
    engine: Engine,
    job_id: int,
    *,
    lane: str | None = None,
    uploads: bool = False,
    photos: Iterable[str] | None = None,
) -> UndoPlan:
    """What an undo of ``job_id`` runs: the lanes (reverse order) and photos that have effects in
    effect (not undone); only the photos whose current path is in ``photos`` when given. ``UnknownJob``;
    ``ValueError`` for a lane the job does not have; ``NotInJob`` naming each path of ``photos`` that
    is no photo the job changed. A plan with no lanes carries the reason in ``note``."""
    with Session(reader(engine)) as s:
        job = s.get(Job, job_id)
        if job is None:
            raise UnknownJob(job_id)
        job_lanes = list(job.lanes or [])
        if lane is not None and lane not in job_lanes:
            raise ValueError(f"job {job_id} has no lane {lane!r}; its lanes are: {', '.join(job_lanes)}")
        wanted = [n for n in job_lanes if n in UNDOABLE and (lane is None or n == lane)]
        if not uploads:
            wanted = [n for n in wanted if n != "upload"]
        live = and_(
            PhotoEffect.job_id == job_id,
            PhotoEffect.lane.in_(wanted),
            PhotoEffect.undone_by.is_(None),
            PhotoEffect.photo_id.is_not(None),
        )
        chosen = PhotoEffect.photo_id.is_not(None)
        if photos is not None:
            wanted_paths = list(dict.fromkeys(photos))
            found = dict(
                s.execute(select(Photo.path, Photo.id).where(Photo.path.in_(wanted_paths))).all()
            ) if wanted_paths else {}  # fmt: skip
            of_job = set(
                s.execute(
                    select(PhotoEffect.photo_id).where(
                        PhotoEffect.job_id == job_id, PhotoEffect.photo_id.in_(list(found.values()))
                    )
                ).scalars()
            ) if found else set()  # fmt: skip
            strangers = [p for p in wanted_paths if found.get(p) not in of_job]
            if strangers:
                raise NotInJob(job_id, strangers)
            live = and_(live, PhotoEffect.photo_id.in_(sorted(of_job)))
            chosen = PhotoEffect.photo_id.in_(sorted(of_job))
        rows = s.execute(select(PhotoEffect.lane, PhotoEffect.photo_id).where(live).distinct()).all()
        lanes_live = {r.lane for r in rows}
        photo_ids = sorted({r.photo_id for r in rows})
        by_path = (
            s.execute(select(Photo.path, Photo.id).where(Photo.id.in_(photo_ids)).order_by(Photo.path)).all()
            if photo_ids
            else []
        )
        paths = [p for p, _ in by_path]
        params = {k: v for k, v in (job.params or {}).items() if not k.startswith("undo.")}
        bundles = list(
            s.execute(
                select(PhotoEffect.to_path).where(
                    PhotoEffect.job_id == job_id,
                    PhotoEffect.lane == "archive",
                    PhotoEffect.photo_id.is_(None),
                )
            ).scalars()
        ) if "archive" in wanted else []  # fmt: skip
        note = None
        if not rows:
            total = (
                s.execute(
                    select(PhotoEffect.undone_by).where(
                        PhotoEffect.job_id == job_id,
                        PhotoEffect.lane.in_(wanted),
                        chosen,
                    )
                )
                .scalars()
                .all()
            )
            by = ", ".join(map(str, sorted({b for b in total if b is not None})))
            note = (
                f"nothing to undo: every effect of job {job_id} was undone already (by job {by})"
                if total
                else f"nothing to undo: job {job_id} applied no file effect"
                + (
                    ""
                    if uploads or "upload" not in job_lanes
                    else " (uploads are left in place without --uploads)"
                )
            )
        if bundles:
            left = f"{', '.join(bundles)} stays: {BUNDLE_STAYS}"
            note = f"{note}; {left}" if note else left
    lanes = [n for n in reversed(job_lanes) if n in lanes_live]
    params.update({UNDO_JOB: job_id, UNDO_UPLOADS: bool(uploads), UNDO_LANES: lanes})
    return UndoPlan(job_id, lanes, paths, params, list(job.roots or []), note, [i for _, i in by_path])


# -- restoring a version on purpose (``photojobs restore``) ----------------------------------------
RESTORE_FROM = "restore.from"  # the effect whose kept original is the version a restore brings back


@dataclass(frozen=True)
class RestorePlan:
    photo_id: int
    path: str  # the photo's current path
    sha256: str  # the version to bring back
    source: int  # the effect whose kept original holds it
    roots: list[str]  # the roots of that effect's job (where its history store is)
    label: str  # "the version before job 3", "the version effect 12 left"
    params: dict[str, Any] = field(default_factory=dict)  # that job's (its archive root, upload folder)


def plan_restore(
    engine: Engine, photo_id: int, *, to_effect: int | None = None, before_job: int | None = None
) -> RestorePlan:
    """Which kept version ``photojobs restore`` brings back: the one effect ``to_effect`` left (its
    after state), or the one before job ``before_job``'s first change of the photo. ``ValueError``
    naming why: an effect or job that did not change this photo, a version that was not kept."""
    if (to_effect is None) == (before_job is None):
        raise ValueError("give exactly one of --to EFFECT and --before JOB")
    with Session(reader(engine)) as s:
        path = s.execute(select(Photo.path).where(Photo.id == photo_id)).scalar_one_or_none()
        if path is None:
            raise ValueError(f"no photo {photo_id}")
        rows = s.execute(
            select(PhotoEffect)
            .where(PhotoEffect.photo_id == photo_id, PhotoEffect.sidecar.is_(False))
            .order_by(PhotoEffect.id)
        ).scalars()
        effects = [_effect(r) for r in rows]
        if to_effect is not None:
            chosen = [e for e in effects if e.id == to_effect]
            if not chosen:
                raise ValueError(
                    f"effect {to_effect} is no change of photo {photo_id} ({path}): see photojobs history"
                )
            wanted, label = chosen[0].after_sha256, f"the version effect {to_effect} left"
        else:
            chosen = [e for e in effects if e.job_id == before_job]
            if not chosen:
                raise ValueError(f"job {before_job} did not change photo {photo_id} ({path})")
            wanted, label = chosen[0].before_sha256, f"the version before job {before_job}"
        sources = [e for e in effects if e.effect == "replace" and e.kept and e.before_sha256 == wanted]
        if not wanted or not sources:
            raise ValueError(
                f"{label} (sha256 {wanted or '-'}) of {path} is not kept in the history (only a version a "
                "job's edit displaced is kept, until PHOTOJOBS_HISTORY_KEEP)"
            )
        source = sources[-1]
        job = s.execute(select(Job.roots, Job.params).where(Job.id == source.job_id)).one_or_none()
    roots, params = (job.roots, job.params) if job is not None else (None, None)
    return RestorePlan(photo_id, path, str(wanted), source.id, list(roots or []), label, dict(params or {}))


# -- retention of kept originals ------------------------------------------------------------------
def expired_kept(engine: Engine, older_than: float, limit: int = 1000) -> list[tuple[list[int], str]]:
    """Kept originals whose every effect row is older than ``older_than`` seconds: (rows, path)."""
    with Session(reader(engine)) as s:
        now = s.execute(select(db_now())).scalar_one()
        cutoff = now - older_than
        rows = s.execute(
            select(PhotoEffect.id, PhotoEffect.kept, PhotoEffect.at).where(PhotoEffect.kept.is_not(None))
        ).all()
    by_path: dict[str, list[tuple[int, float]]] = {}
    for rid, kept, at in rows:
        by_path.setdefault(kept, []).append((rid, at))
    out = [([rid for rid, _ in v], k) for k, v in by_path.items() if max(at for _, at in v) < cutoff]
    return out[:limit]


def kept_paths(engine: Engine) -> set[str]:
    """Every kept file something still names: an effect, or an intent not yet settled."""
    with Session(reader(engine)) as s:
        found = set(s.execute(select(PhotoEffect.kept).where(PhotoEffect.kept.is_not(None))).scalars())
        for detail in s.execute(select(Intent.detail).where(Intent.state == "recorded")).scalars():
            if isinstance(detail, dict) and isinstance(detail.get("kept"), str):
                found.add(detail["kept"])
    return found


def forget_kept(engine: Engine, ids: Iterable[int]) -> None:
    ids = list(ids)
    if not ids:
        return
    with Session(engine) as s, s.begin():
        s.execute(update(PhotoEffect).where(PhotoEffect.id.in_(ids)).values(kept=None))
