"""A photo's way back (issue 39): the one place that decides whether an undo may put a photo back.

The undo item (``actors.undo``) asks it just before it moves anything, lane by lane, and refuses the
photo with its answer; ``photojobs undo J --dry-run`` (:func:`preview`) asks it for every photo of
the plan at once, with nothing moved and no job submitted, simulating the undo's lanes in order (the
effects of the lanes before are taken as undone by then). A refusal is a ``PhotoError`` whose reason
says what changed: a later job's effect really in the way (the chain rule, ``store.history
.in_the_way``), a change outside photojobs (content, path, an old path taken), or an original its
whole way back needs that is no longer kept (all or nothing per photo).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from photos import history as kept_files
from photos.errors import OutsideRoot, PhotoError
from photos.params import job_roots
from photos.recovery import content_of
from photos.rootfs import Roots

from . import history as log
from .history import Effect, UndoPlan

if TYPE_CHECKING:
    from sqlalchemy import Engine

CHANGED = "changed since job {job}"
# A copy an undo moved into the history store, and moved back by the undo of that undo (a redo):
# effects on a copy, not on the photo (which stays where it is).
REMOVALS = ("upload removed", "file removed")
RESTORES = {"upload removed": "upload restored", "file removed": "file restored"}
COPIES = (*REMOVALS, *RESTORES.values())


@dataclass(frozen=True)
class Way:
    """One photo's way back through an undo of ``job``: where it is now, the undo's lanes in order,
    and the undo job running it (None in a dry run)."""

    engine: Engine
    fs: Roots
    job: int
    photo: int
    path: str | None
    lanes: tuple[str, ...]
    undo_job: int | None = None
    # Called with an old path a move goes back to that another file holds: raises (``Deferred``)
    # when that file is a photo this undo will move away first; returns when it is not.
    leaving: Callable[[str], None] | None = None
    pending: frozenset[int] = field(default_factory=frozenset)  # a dry run's effects undone by then


def refuse_if_changed(way: Way, todo: list[Effect], *, content: bool = True) -> None:
    """PhotoError "changed since job J …" unless the photo (and its sidecars) are exactly as the
    job left them: no later effect in effect, the same content at the same path, old paths free.
    Each path is looked at beneath the job's roots (``way.fs``), as the reversal then acts: a path
    outside them, or whose folder is a symlink, is refused. ``content`` False (a dry run's later
    lanes, whose files an earlier lane's undo would have moved) checks the later effects only."""
    job = way.job
    mine = {e.id for e in log.effects_of(way.engine, job, photo_id=way.photo)}
    last = max(r.id for r in todo)
    later = [
        e
        for e in log.in_the_way(log.later_effects(way.engine, way.photo, last), last)
        if e.id not in {r.id for r in todo}
        and e.id not in way.pending  # a dry run: undone by the undo's lanes before this one
        and e.lane != "upload"  # a copy made (or removed) elsewhere: the photo is unchanged
        and e.job_id is not None  # a move found by a sync: "outside photojobs", checked below
        and (way.undo_job is None or e.job_id != way.undo_job)  # this undo's own earlier lanes
        and e.undoes not in mine  # an earlier undo of another lane of the same job
    ]
    if later:
        first = later[0]
        which = f"job {first.job_id}'s {first.lane}" + (" (undo it first)" if first.job_id != job else "")
        if first.job_id == job:
            which += f" (undo it first: photojobs undo {job} --lane {first.lane})"
        else:
            which += f": photojobs undo {first.job_id}"
        raise PhotoError(Path(first.to_path), f"{CHANGED.format(job=job)} by {which}")
    if not content:
        return
    outside = f"{CHANGED.format(job=job)} outside photojobs"
    # the photo's own effects (not a copy: an upload, a new sidecar, or an undo's removal of one)
    photo_rows = [r for r in todo if not r.sidecar and r.effect != "publish" and r.kind not in COPIES]
    if photo_rows and way.path != photo_rows[0].to_path:
        raise PhotoError(Path(way.path or "?"), f"{outside}: it is no longer at {photo_rows[0].to_path}")
    for r in todo:
        target = Path(r.to_path)
        way.fs.lstat(target)  # OutsideRoot (or NotBeneath): never trusted from the store alone
        have = content_of(target, within=way.fs)
        if have != r.after_sha256:
            found = f"holds sha256 {have}" if have else "is gone"
            raise PhotoError(target, f"{outside}: {found}; job {job} left sha256 {r.after_sha256}")
        if r.effect == "move" and r.from_path and way.fs.lstat(Path(r.from_path)) is not None:
            if way.leaving is not None:
                way.leaving(r.from_path)  # Deferred while a photo of this undo will leave it
            elif way.undo_job is None and log.freed_by_undo(way.engine, job, r.from_path, way.photo):
                continue  # a dry run: the photo there now is moved away by its own undo first
            raise PhotoError(Path(r.from_path), f"{outside}: its old path is taken by another file")


def refuse_if_originals_gone(way: Way, lane: str) -> None:
    """All or nothing per photo: before the first of the photo's undo lanes moves anything, every
    original its whole way back needs (the undo's lanes still to come for this photo, ``lane``
    included) is still kept and intact; else the photo is refused whole, left exactly as it is
    (never renamed back with its edit still in place)."""
    lanes = list(way.lanes) or [lane]
    ahead = set(lanes[lanes.index(lane) :] if lane in lanes else [lane])
    needed = [
        r
        for r in log.effects_of(way.engine, way.job, photo_id=way.photo)
        if r.undone_by is None and r.effect == "replace" and r.lane in ahead
    ]
    for r in needed:
        try:
            bases = [p for p in (way.path, r.to_path) if p]  # a delta's base: the photo now
            kept_files.kept_file(r.kept, r.before_sha256, within=way.fs, bases=bases)
        except PhotoError as exc:
            raise PhotoError(
                Path(way.path or r.to_path),
                f"not undone, left as it is: its way back needs the original its {r.kind} (job "
                f"{way.job}, effect {r.id}) displaced, and {exc.reason}",
            ) from None


def check_lane(way: Way, lane: str, todo: list[Effect], *, first: bool = True) -> None:
    """The check an undo item makes before reversing ``todo`` (the photo's effects of ``lane`` in
    effect): nothing changed since (``first`` False: a dry run's later lane, the later effects only),
    and every original the photo's way back needs still kept. ``PhotoError`` refuses the photo."""
    refuse_if_changed(way, todo, content=first)
    refuse_if_originals_gone(way, lane)


def plan_photo(way: Way) -> dict[str, Any]:
    """A dry run of one photo: ``{"path", "action": "restore"|"refuse", "reason"}``, by the same
    checks the undo's items make (:func:`check_lane`), lane after lane in the undo's order, each
    later lane checked as if the lanes before had been undone."""
    rows = [
        r
        for r in log.effects_of(way.engine, way.job, photo_id=way.photo)
        if r.undone_by is None and r.lane in way.lanes
    ]
    pending: set[int] = set()
    steps: list[str] = []
    for lane in way.lanes:
        todo = [r for r in rows if r.lane == lane]
        if not todo:
            continue
        if any(r.effect == "remote" for r in todo):  # an S3 copy: deleted only if still the job's
            steps.append(f"{lane}: the remote copy is deleted if still the object job {way.job} uploaded")
            pending |= {r.id for r in todo}
            continue
        try:
            check_lane(replace(way, pending=frozenset(pending)), lane, todo, first=not pending)
        except (PhotoError, OutsideRoot) as exc:
            return {"path": way.path, "action": "refuse", "reason": str(exc)}
        steps.append(f"{lane}: " + ", ".join(sorted({_step(r) for r in todo})))
        pending |= {r.id for r in todo}
    return {"path": way.path, "action": "restore", "reason": "; ".join(steps) or "nothing in effect"}


def _step(r: Effect) -> str:
    if r.effect == "replace":
        return f"{r.kind} reverted from the kept original"
    if r.effect == "move" and r.from_path:
        return f"{r.kind} moved back to {r.from_path}"
    return f"{r.kind} {r.to_path} moved into the history store"


def preview(engine: Engine, plan: UndoPlan) -> dict[str, Any]:
    """``{"dry_run": True, "plan": [{"path", "action", "reason"}, …], "job": None}`` for every photo of
    ``plan`` (``store.history.plan_undo``): nothing is changed and no job submitted."""
    out: list[dict[str, Any]] = []
    with Roots(job_roots(plan.roots, plan.params)) as fs:
        for photo, path in zip(plan.photo_ids, plan.paths, strict=True):
            way = Way(engine, fs, plan.job_id, photo, path, tuple(plan.lanes))
            out.append(plan_photo(way))
    found: dict[str, Any] = {"dry_run": True, "job": None, "plan": out}
    if plan.note:
        found["note"] = plan.note
    return found
