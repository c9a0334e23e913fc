"""The ``archive`` lane: move originals into dated folders under the archive root, or (with
``archive.bundle=zip|tar``) write one bundle of the job's photos with a manifest of paths and
SHA-256s. A bundle copies: the originals stay where they are. A raw's XMP sidecars move (or are
bundled) with it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.archive import archive_relpath, build_bundle, verify_bundle
from photos.capture_time import FILE_TIME
from photos.containment import open_inside
from photos.errors import PhotoError
from photos.sidecar import companion_target, companions
from store.items import bundle_members

from .common import (
    check_photo,
    destination_root,
    facts_for,
    fallback_time,
    make_destination,
    params,
    photo_path,
    photo_root,
    readable_roots,
)
from .effects import FileEffects, TargetTaken, result_of
from .lane import lane_actor
from .moves import MAX_SUFFIX, move_photo


def archive_photo(ctx: ItemContext) -> dict[str, Any]:
    """One archive item (the lane's work, without Dramatiq: the actor ``archive`` runs it)."""
    effects = FileEffects(ctx)
    recovered = effects.recover()
    if recovered:
        return {"target": recovered[-1].target, "recovered": True}
    opts = params(ctx)
    root = destination_root(ctx, opts["root"])  # checked before a folder is made beneath its roots
    make_destination(ctx, root)
    if opts.get("bundle", "none") != "none":
        return _bundle(ctx, effects, root, opts["bundle"])
    path = photo_path(ctx)
    facts = facts_for(ctx, path)
    relpath = archive_relpath(facts, path, fallback_time(facts, path))
    result = move_photo(ctx, effects, path, root, relpath, [])
    if not result.get("recovered"):
        result["taken_from"] = facts.get("taken_from") if facts.get("taken") else FILE_TIME
    fileops.prune_empty_dirs(path.parent, photo_root(ctx, path), within=effects.fs)
    return result


archive = lane_actor("archive")(archive_photo)


def _bundle(ctx: ItemContext, effects: FileEffects, root: Path, kind: str) -> dict[str, Any]:
    members = bundle_members(ctx.engine, ctx.item_id)
    if not members:
        return {"bundle": None, "photos": 0, "note": "no photo reached the archive lane"}
    sources = [(Path(path), f"{pid:06d}_{Path(path).name}") for pid, path in members]
    for src, _ in sources:
        if src.is_symlink() or src.exists():
            check_photo(ctx, src)  # every member at the moment of use, before a byte is read
    # a photo whose earlier lane failed for a missing file is in the bundle's members (a failed
    # edit never keeps a photo out of its backup) but has nothing to back up: named, not bundled
    missing = [str(src) for src, _ in sources if not src.exists() and not src.is_symlink()]
    sources = [(src, name) for src, name in sources if str(src) not in missing]
    if not sources:
        return {"bundle": None, "photos": 0, "missing": missing, "note": "every member's file is gone"}
    for src, _ in sources:
        if not src.is_file():
            raise PhotoError(src, "not a regular file")
    photos = len(sources)
    # a photo's XMP sidecars go into the bundle with it, named after its name in the bundle
    sources += [
        (c, companion_target(c, src, Path(name)).name) for src, name in list(sources) for c in companions(src)
    ]
    failpoints.hit("archive.after_check")
    roots = readable_roots(ctx) or None

    def open_checked(src: Path) -> BinaryIO:  # each member opened checked inside the roots
        if roots is None:
            return open(src, "rb")  # noqa: SIM115 - build_bundle closes it
        return os.fdopen(open_inside(src, roots, resolve_roots=False), "rb")

    for n in range(MAX_SUFFIX):
        suffix = f"_{n}" if n else ""
        target = root / f"photojobs-job{ctx.lease.job_id}{suffix}.{kind}"
        if target.exists():
            continue
        effects.sweep_temps(root)
        staged = fileops.staged_path(target, effects.tag)
        manifest = build_bundle(sources, staged, kind, opener=open_checked, within=effects.fs)
        try:
            verify_bundle(staged, manifest)
            failpoints.hit("archive.after_stage")
            ctx.check()
            sha = fileops.content_sha256(staged, within=effects.fs)
            if sha is None:
                raise PhotoError(target, "the bundle written is gone or out of reach; not published")
            intent = effects.record(kind="publish", staged=staged, target=target, source=None, sha256=sha)
        except TargetTaken:
            effects.drop(staged)
            continue
        except BaseException:
            effects.drop(staged)
            raise
        applied = effects.apply_and_mark(
            intent, kind="publish", staged=staged, target=target, source=None, sha256=sha
        )
        extra = {"missing": missing} if missing else {}
        return result_of(applied, bundle=str(target), photos=photos, sha256=sha, **extra)
    raise PhotoError(root, f"no free bundle name after {MAX_SUFFIX} tries")
