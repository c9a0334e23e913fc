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
from middleware.context import Deferred, ItemContext
from photos import fileops, history
from photos.errors import OutsideRoot, PhotoError
from photos.recovery import content_of, link_staged
from store import history as log
from store.history import BUNDLE_STAYS, RESTORE_FROM, UNDO_JOB, UNDO_LANES, UNDO_UPLOADS, Effect
from store.way_back import CHANGED, COPIES, RESTORES, Way, check_lane

from .effects import FileEffects, TargetTaken
from .undo_remote import undo_remote

DEFER = 0.5  # seconds an undo item waits for a photo of its job to leave the name it goes back to


def undoable(fn: Callable[[ItemContext], Any]) -> Callable[[ItemContext], Any]:
    """A lane's work, or the undo of the lane's effects when the item belongs to an undo job."""

    @functools.wraps(fn)
    def run(ctx: ItemContext) -> Any:
        if ctx.params.get(UNDO_JOB) is not None:
            return undo_item(ctx)
        if ctx.params.get(RESTORE_FROM) is not None:
            return restore_item(ctx)
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
    check_lane(_way(ctx, effects, job, lane), lane, todo)
    unit = sorted(todo, key=lambda r: (r.sidecar, -r.id))  # the photo's effect first, then its sidecars
    try:
        done = _reverse(ctx, effects, unit)
    except TargetTaken as exc:  # a photo's row still names an old path its file has just left
        _wait_for_leaving(ctx, effects, job, str(exc))
        raise PhotoError(Path(str(exc)), f"{CHANGED.format(job=job)} outside photojobs: its old path is "
                         "named by another photo") from None  # fmt: skip
    return {"undone": len(done), "job": job, "effects": [r.id for r in unit], "paths": done}


# -- conflicts (decided in store.way_back: the dry run asks the same) ---------------------------
def _way(ctx: ItemContext, effects: FileEffects, job: int, lane: str) -> Way:
    return Way(
        ctx.engine, effects.fs, job, ctx.lease.photo_id or 0, ctx.photo_path,
        tuple(str(n) for n in ctx.params.get(UNDO_LANES) or [lane]), undo_job=ctx.lease.job_id,
        leaving=functools.partial(_wait_for_leaving, ctx, effects, job),
    )  # fmt: skip


def _wait_for_leaving(ctx: ItemContext, effects: FileEffects, job: int, path: str) -> None:
    """``Deferred`` when the photo holding ``path`` (the old path a move goes back to) is one this
    undo job will move away: the job took the name again after freeing it (a burst renamed, then
    archived), so the later taker's undo goes first — the exact reverse order of the effects, across
    photos, whatever order the items run in. Returns when the holder is not such a photo."""
    holder = log.leaving_occupant(ctx.engine, ctx.lease.job_id, job, path, ctx.lease.photo_id or 0)
    if holder is not None:
        raise Deferred(f"{path} is held by photo {holder} until its own undo in this job moves it", DEFER)
    try:
        there = effects.fs.lstat(Path(path))  # beneath the job's roots, no symlink followed
    except (OSError, OutsideRoot):
        return  # not a name this undo may move into: the caller refuses the photo
    if there is None and not log.name_held(ctx.engine, path):
        # The photo that held it has just left (its own undo settled between the caller's look
        # and this one, two workers racing on PostgreSQL): the name is free, try again.
        raise Deferred(f"{path} was freed meanwhile", DEFER)


# -- reversing ------------------------------------------------------------------------------------
def _reverse(ctx: ItemContext, effects: FileEffects, unit: list[Effect]) -> list[str]:
    """Stage every reversal, record them as one unit (one fenced transaction), apply each in order."""
    plans: list[dict[str, Any]] = []
    try:
        for r in unit:
            plans.append(_plan(ctx, effects, r))
        failpoints.hit(f"{effects.lane}.after_stage")  # staged, nothing recorded yet
        ctx.check()  # last safe point: nothing recorded yet
        # keeping what a restore displaces may refuse (a history store that is a symlink): untouched
        intents = effects.record_unit(plans)
    except BaseException:
        for p in plans:
            if p["staged"] != p["source"]:
                effects.drop(Path(p["staged"]))
        raise
    done = []
    for intent, p, r in zip(intents, plans, unit, strict=True):
        try:
            effects.apply_and_mark(
                intent, kind=p["kind"], staged=p["staged"], target=p["target"], source=p["source"],
                sha256=p["sha256"], companion=p["companion"],
            )  # fmt: skip
        except FileExistsError:  # a file took the old name meanwhile: never clobbered
            for i, q in zip(intents[len(done) :], plans[len(done) :], strict=True):
                effects.discard(i, q["kind"], q["staged"], q["target"], "old path taken meanwhile",
                                source=q["source"], companion=q["companion"])  # fmt: skip
            # Another photo of this undo moved into the freed name while this one recorded its move
            # (PostgreSQL, read committed: the record's look at the photos' rows ran before that
            # photo's move committed, and its insert waited for it): the photo there will leave the
            # name once its own undo runs — wait for it, as the record's check would have a moment
            # later. A file no photo of this undo will move away still refuses the photo.
            _wait_for_leaving(ctx, effects, r.job_id, str(p["target"]))
            raise PhotoError(
                p["target"], f"changed since: {p['target']} was taken meanwhile; not moved back"
            ) from None
        done.append(str(p["target"]))
        if p["kind"] == "move":
            _remove_made_folders(ctx, effects, r, Path(p["source"]).parent)
    return done


def _remove_made_folders(ctx: ItemContext, effects: FileEffects, r: Effect, moved_from: Path) -> None:
    """The folders the undone effect made (a rename's, archive's or upload's dated folders), each
    removed if empty now, by descriptor beneath its root (a folder that existed before stays; one
    swapped for a symlink, or not empty, stops it). An effect that does not say which it made (logged
    before they were recorded): its empty folders up to the root, as before."""
    made = log.made_dirs(ctx.engine, r)
    if made is None:
        fileops.prune_empty_dirs(moved_from, effects.root_of(moved_from / "x"), within=effects.fs)
        return
    for folder in made:  # deepest first
        try:
            effects.fs.remove_folder(Path(folder))
        except FileNotFoundError:
            continue  # removed already (a sidecar's undo, an earlier attempt)
        except (OSError, OutsideRoot):
            return


def _plan(ctx: ItemContext, effects: FileEffects, r: Effect) -> dict[str, Any]:
    detail = {"undoes": r.id, "sidecar": r.sidecar}
    target_now = Path(r.to_path)
    effects.sweep_temps(target_now.parent)
    if r.effect == "replace":
        # a whole copy, or a delta rebuilt against the photo as it is now (verified by SHA-256)
        staged = history.stage_original(
            r.kept, r.before_sha256, target_now, effects.tag, within=effects.fs, bases=[target_now]
        )
        if fileops.content_sha256(staged, within=effects.fs) != r.before_sha256:
            effects.drop(staged)
            raise PhotoError(Path(str(r.kept)), "the kept original did not copy intact; not restored")
        return {"kind": "replace", "staged": staged, "target": target_now, "source": target_now,
                "sha256": r.before_sha256, "base_sha256": r.after_sha256, "companion": r.sidecar,
                "detail": {**detail, "kind": "metadata edit"}}  # fmt: skip
    if r.effect == "move" and r.from_path:
        staged = link_staged(target_now, effects.tag, within=effects.fs) or target_now
        # a copy an undo removed goes back where it was (a redo), one it put back goes away again
        copy = r.kind in COPIES
        kind = RESTORES.get(r.kind) or {v: k for k, v in RESTORES.items()}.get(r.kind) or "move"
        return {"kind": "move", "staged": staged, "target": Path(r.from_path), "source": target_now,
                "sha256": r.after_sha256, "base_sha256": r.after_sha256, "companion": r.sidecar or copy,
                "detail": {**detail, "kind": kind}}  # fmt: skip
    if r.effect == "publish" and r.after_sha256:
        # a copy (upload) or a new sidecar: moved into the history store, kept until retention (a
        # store that is a symlink or not a folder refuses the undo: nothing is moved anywhere else)
        photo = Path(ctx.photo_path or r.to_path)
        away = history.removed_path(photo, r.after_sha256, r.intent_id, within=effects.fs)
        staged = link_staged(target_now, effects.tag, within=effects.fs) or target_now
        return {"kind": "move", "staged": staged, "target": away, "source": target_now,
                "sha256": r.after_sha256, "base_sha256": r.after_sha256, "companion": True,
                "detail": {**detail, "kind": "upload removed" if r.lane == "upload" else "file removed",
                           "kept": str(away)}}  # fmt: skip
    raise PhotoError(target_now, f"cannot undo a {r.effect} effect")


# -- restoring a version on purpose (photojobs restore) ---------------------------------------------
def restore_item(ctx: ItemContext) -> dict[str, Any]:
    """Bring back a kept version of the photo (``store.history.plan_restore``) over whatever it holds
    now — an edit by hand included, on purpose — as a metadata edit does: staged from the verified
    kept file, recorded (the version it displaces kept in the history first, so the restore can be
    undone), replaced atomically beneath the job's roots, marked. A photo already at that version is
    left alone; one whose current version cannot be kept is refused, untouched."""
    effects = FileEffects(ctx)
    effects.lane = f"restore.{ctx.spec.name}"
    effects.recover()
    source = log.effect_by_id(ctx.engine, int(ctx.params[RESTORE_FROM]))
    target = Path(ctx.photo_path or "?")
    if source is None or source.photo_id != ctx.lease.photo_id or source.before_sha256 is None:
        raise PhotoError(target, "not restored: the version asked for is not one of this photo's")
    effects.fs.lstat(target)  # OutsideRoot (or NotBeneath): the photo is beneath the job's roots
    have = content_of(target, within=effects.fs)
    if have is None:
        raise PhotoError(target, "not restored: the photo is gone")
    if have == source.before_sha256:
        return {"restored": 0, "note": "already that version"}
    effects.sweep_temps(target.parent)
    # a whole copy, or a delta rebuilt against its base (the photo now, or the history store)
    staged = history.stage_original(
        source.kept, source.before_sha256, target, effects.tag, within=effects.fs, bases=[target]
    )
    plan: dict[str, Any] = {
        "kind": "replace", "staged": staged, "target": target, "source": target,
        "sha256": source.before_sha256, "base_sha256": have, "companion": False,
        "detail": {"kind": "restored", "restores": source.id},
    }  # fmt: skip
    try:
        if fileops.content_sha256(staged, within=effects.fs) != source.before_sha256:
            kept_at = Path(source.kept or target)
            raise PhotoError(kept_at, "the kept version did not stage intact; not restored")
        ctx.check()  # last safe point: nothing recorded yet
        (intent,) = effects.record_unit([plan])
    except BaseException:
        effects.drop(staged)
        raise
    if not plan["detail"].get("kept"):  # the version it would displace is not kept: refused
        effects.discard(intent, "replace", staged, target, "current version not kept", source=target)
        raise PhotoError(target, f"not restored: its current version (sha256 {have}) could not be kept")
    effects.apply_and_mark(
        intent, kind="replace", staged=staged, target=target, source=target, sha256=source.before_sha256
    )
    return {"restored": 1, "effect": source.id, "sha256": source.before_sha256}
