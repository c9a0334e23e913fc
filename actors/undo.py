"""Undo: an item of an undo job (``photojobs undo JOB``) reverses what the undone job's item of the
same lane did to its photo, through the same intent protocol as every effect (stage, record fenced,
apply atomically, mark — ``actors.effects``), so it happens exactly once under kills and retries.

The effects come from the effect log (``store.history``), newest first, as one unit per photo (a raw
and its sidecars are recorded together and move back together):

- a metadata edit (``replace``) is restored byte for byte from the displaced original the edit kept
  (``photos.history``), verified before use; the file the restore displaces is kept in turn, so
  undoing the undo redoes the edit byte for byte;
- a rename, archive or undo move (``move``) moves back to its old path, never clobbering;
- a new file (``publish``: a local upload's copy with ``--uploads``, a sidecar an edit created) is
  moved into the history store (kept until retention, so a redo can put it back); the photo
  itself is never removed;
- an upload to an S3 target (``remote``) with ``--uploads``: the remote copy is deleted if it is
  still the object the job uploaded (``actors.undo_remote``);
- an archive bundle is never undone: it is a copy (the originals never moved), a backup an undo
  does not delete; the planner leaves it out and says so, and a bundle item is refused.

A photo changed since the undone job is refused, untouched: the item fails "changed since …" naming
the later job (which must be undone first) or "outside photojobs" (its content or path is not what
the job left, or its old path is taken); the job's other photos are undone (the job ends partial).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops, history
from photos.containment import resolve_inside
from photos.errors import PhotoError
from photos.recovery import content_of, link_staged
from store import history as log
from store.history import BUNDLE_STAYS, UNDO_JOB, UNDO_UPLOADS, Effect

from .common import check_photo, readable_roots
from .effects import FileEffects
from .undo_remote import undo_remote

CHANGED = "changed since job {job}"


def undoable(fn: Callable[[ItemContext], Any]) -> Callable[[ItemContext], Any]:
    """A lane's work, or the undo of the lane's effects when the item belongs to an undo job."""

    @functools.wraps(fn)
    def run(ctx: ItemContext) -> Any:
        if ctx.params.get(UNDO_JOB) is not None:
            return undo_item(ctx)
        return fn(ctx)

    return run


def undo_item(ctx: ItemContext) -> dict[str, Any]:
    job = int(ctx.params[UNDO_JOB])
    lane = ctx.spec.name
    effects = FileEffects(ctx)
    effects.lane = f"undo.{lane}"  # failpoints: undo.<lane>.after_record, .after_apply, .after_mark
    effects.recover()  # an earlier attempt's undo intents: finished or discarded, from the disk
    photo = ctx.lease.photo_id
    if photo is None:  # an undo job never plans one (store.history.plan_undo): refused, not skipped
        raise PhotoError(None, BUNDLE_STAYS)
    if lane == "upload" and not ctx.params.get(UNDO_UPLOADS):
        return {"undone": 0, "note": "uploads are left in place (undo --uploads removes the copies)"}
    rows = log.effects_of(ctx.engine, job, lane=lane, photo_id=photo)
    todo = [r for r in rows if r.undone_by is None]
    if not todo:
        by = sorted({r.undone_by for r in rows if r.undone_by is not None})
        note = f"already undone by job {', '.join(map(str, by))}" if by else f"job {job} changed nothing here"
        return {"undone": 0, "note": note}
    remote = [r for r in todo if r.effect == "remote"]
    if remote:  # an upload to an S3 target: deleted only if still the job's object (actors.undo_remote)
        return undo_remote(ctx, job, remote)
    _refuse_if_changed(ctx, job, todo)
    unit = sorted(todo, key=lambda r: (r.sidecar, -r.id))  # the photo's effect first, then its sidecars
    done = _reverse(ctx, effects, unit)
    return {"undone": len(done), "job": job, "effects": [r.id for r in unit], "paths": done}


# -- conflicts ------------------------------------------------------------------------------------
def _refuse_if_changed(ctx: ItemContext, job: int, todo: list[Effect]) -> None:
    """PhotoError "changed since job J …" unless the photo (and its sidecars) are exactly as the
    job left them: no later effect in effect, the same content at the same path, old paths free."""
    photo = ctx.lease.photo_id or 0
    mine = {e.id for e in log.effects_of(ctx.engine, job, photo_id=photo)}
    later = [
        e
        for e in log.later_effects(ctx.engine, photo, max(r.id for r in todo))
        if e.id not in {r.id for r in todo}
        and e.lane != "upload"  # a copy made (or removed) elsewhere: the photo is unchanged
        and e.job_id != ctx.lease.job_id  # this undo's own earlier lanes
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
    outside = f"{CHANGED.format(job=job)} outside photojobs"
    photo_rows = [r for r in todo if not r.sidecar and r.effect != "publish"]
    if photo_rows and ctx.photo_path != photo_rows[0].to_path:
        raise PhotoError(
            Path(ctx.photo_path or "?"), f"{outside}: it is no longer at {photo_rows[0].to_path}"
        )
    for r in todo:
        target = Path(r.to_path)
        _check_inside(ctx, target)
        have = content_of(target)
        if have != r.after_sha256:
            found = f"holds sha256 {have}" if have else "is gone"
            raise PhotoError(target, f"{outside}: {found}; job {job} left sha256 {r.after_sha256}")
        if r.effect == "move" and r.from_path:
            _check_inside(ctx, Path(r.from_path))
            if Path(r.from_path).exists() or Path(r.from_path).is_symlink():
                raise PhotoError(Path(r.from_path), f"{outside}: its old path is taken by another file")


def _check_inside(ctx: ItemContext, path: Path) -> None:
    """Every path the undo touches lies inside the job's roots (or its archive root, or its local
    upload target): never trusted from the store alone."""
    roots = readable_roots(ctx)
    target = ctx.params.get("upload.target")
    if isinstance(target, str) and target and "://" not in target:
        roots.append(Path(target))
    if roots:
        resolve_inside(path, roots, resolve_roots=False)
    else:
        check_photo(ctx, path)


# -- reversing ------------------------------------------------------------------------------------
def _reverse(ctx: ItemContext, effects: FileEffects, unit: list[Effect]) -> list[str]:
    """Stage every reversal, record them as one unit (one fenced transaction), apply each in order."""
    plans: list[dict[str, Any]] = []
    try:
        for r in unit:
            plans.append(_plan(ctx, effects, r))
        failpoints.hit(f"{effects.lane}.after_stage")  # staged, nothing recorded yet
        ctx.check()  # last safe point: nothing recorded yet
    except BaseException:
        for p in plans:
            if p["staged"] != p["source"]:
                Path(p["staged"]).unlink(missing_ok=True)
        raise
    intents = effects.record_unit(plans)
    done = []
    for intent, p in zip(intents, plans, strict=True):
        try:
            effects.apply_and_mark(
                intent, kind=p["kind"], staged=p["staged"], target=p["target"], source=p["source"],
                sha256=p["sha256"], companion=p["companion"],
            )  # fmt: skip
        except FileExistsError:  # a file took the old name meanwhile: never clobbered
            for i, q in zip(intents[len(done) :], plans[len(done) :], strict=True):
                effects.discard(i, q["kind"], q["staged"], q["target"], "old path taken meanwhile",
                                source=q["source"], companion=q["companion"])  # fmt: skip
            raise PhotoError(
                p["target"], f"changed since: {p['target']} was taken meanwhile; not moved back"
            ) from None
        done.append(str(p["target"]))
        if p["kind"] == "move":
            moved_from = Path(p["source"]).parent  # a rename's or archive's dated folders, if now empty
            fileops.prune_empty_dirs(moved_from, effects._root_of(moved_from / "x"))
    return done


def _plan(ctx: ItemContext, effects: FileEffects, r: Effect) -> dict[str, Any]:
    detail = {"undoes": r.id, "sidecar": r.sidecar}
    target_now = Path(r.to_path)
    effects.sweep_temps(target_now.parent)
    if r.effect == "replace":
        kept = history.kept_file(r.kept, r.before_sha256)
        staged = fileops.stage_copy(kept, target_now, effects.tag)
        if fileops.sha256_file(staged) != r.before_sha256:
            staged.unlink(missing_ok=True)
            raise PhotoError(kept, "the kept original did not copy intact; not restored")
        return {"kind": "replace", "staged": staged, "target": target_now, "source": target_now,
                "sha256": r.before_sha256, "base_sha256": r.after_sha256, "companion": r.sidecar,
                "detail": {**detail, "kind": "metadata edit"}}  # fmt: skip
    if r.effect == "move" and r.from_path:
        staged = link_staged(target_now, effects.tag) or target_now
        return {"kind": "move", "staged": staged, "target": Path(r.from_path), "source": target_now,
                "sha256": r.after_sha256, "base_sha256": r.after_sha256, "companion": r.sidecar,
                "detail": {**detail, "kind": "move"}}  # fmt: skip
    if r.effect == "publish" and r.after_sha256:
        # a copy (upload) or a new sidecar: moved into the history store, kept until retention
        store = history.store_for(effects._root_of(Path(ctx.photo_path or r.to_path)))
        away = history.blob_path(store, r.after_sha256).with_name(f"{r.after_sha256}.removed-{r.intent_id}")
        staged = link_staged(target_now, effects.tag) or target_now
        return {"kind": "move", "staged": staged, "target": away, "source": target_now,
                "sha256": r.after_sha256, "base_sha256": r.after_sha256, "companion": True,
                "detail": {**detail, "kind": "upload removed" if r.lane == "upload" else "file removed",
                           "kept": str(away)}}  # fmt: skip
    raise PhotoError(target_now, f"cannot undo a {r.effect} effect")
