"""The ``upload`` lane: to a local folder (staged + no-clobber publish) or S3 (conditional, resumable).

A raw's XMP sidecars go with it, named after the raw's key as they are named after the raw on disk
(``IMG_0001.CR2.xmp`` -> KEY + ``.xmp``, ``IMG_0001.xmp`` -> the key's stem + ``.xmp``): locally
all published under one unit of intents (recorded together, photo first), to S3 as objects of
their own after the photo (conditional, content-addressed: a repeat is a no-op)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.containment import Pinned, pin_inside
from photos.errors import PhotoError
from photos.params import ALLOWED_ROOTS_KEY
from photos.sidecar import companion_target, companions
from photos.upload import LocalTarget, S3Target, UploadResult, UploadTarget, object_key, parse_target
from store.history import RemoteEffect, log_remote

from .common import destination_root, facts_for, fallback_time, params, photo_path, readable_roots
from .effects import FileEffects, result_of
from .lane import lane_actor


def upload_photo(ctx: ItemContext) -> dict[str, Any]:
    """One upload item (the lane's work, without Dramatiq: the actor ``upload`` runs it)."""
    opts = params(ctx)
    spec = parse_target(opts["target"], opts.get("endpoint"))
    if spec.kind == "local":  # the folder written into, re-checked at the moment of use
        spec = replace(spec, root=destination_root(ctx, spec.root or opts["target"]))
    effects = FileEffects(ctx)
    if spec.kind == "local":
        recovered = [a for a in effects.recover() if not a.companion]
        if recovered:  # the photo's own publish (a unit's sidecars alone: the photo was there already)
            return result_of(recovered[-1])
    path = photo_path(ctx)
    # every byte of the photo copied or sent is read from the inode checked here (a symlink swapped
    # in at its path later is never read); errors name the photo
    with pin_inside(path, readable_roots(ctx) or None, resolve_roots=False) as pinned, pinned.as_photo():
        return _upload(ctx, opts, spec, effects, pinned)


upload = lane_actor("upload")(upload_photo)


def _upload(
    ctx: ItemContext, opts: dict[str, Any], spec: UploadTarget, effects: FileEffects, pinned: Pinned
) -> dict[str, Any]:
    path = pinned.path
    facts = facts_for(ctx, path)
    # hashed through the checked descriptor: the copy and the S3 checksum verify it
    sha = pinned.sha256()
    facts = {**facts, "sha256": sha}
    key = object_key(opts.get("key"), facts, path, fallback_time(facts, path))
    allowed = ctx.params.get(ALLOWED_ROOTS_KEY)  # a local folder is made beneath them, none followed
    target = spec.connect(within=None if allowed is None else [Path(r) for r in allowed])
    sidecars = [(c, sidecar_key(c, path, key), fileops.sha256_file(c)) for c in companions(path)]
    failpoints.hit("upload.after_check")
    if isinstance(target, S3Target):
        ctx.check()
        mine = uploader_metadata(ctx)
        result = target.upload(
            pinned.name, key, sha, checkpoint=ctx.saved_checkpoint, save_checkpoint=ctx.checkpoint,
            metadata=mine,
        )  # fmt: skip
        sent = [(path, result, False)]
        extra = {}
        if sidecars:
            failpoints.hit("upload.between_unit_moves")
            sent += [(c, target.upload(c, c_key, c_sha, metadata=mine), True) for c, c_key, c_sha in sidecars]
            extra["sidecars"] = [r.location for _, r, _ in sent[1:]]
        log_uploads(ctx, target, opts, sent)
        return {
            "location": result.location,
            "key": result.key,
            "sha256": sha,
            "already_present": result.already_present,
            **extra,
        }
    if not isinstance(target, LocalTarget):
        raise RuntimeError('internal error: expected isinstance(target, LocalTarget)')
    dest = target.destination(key)
    effects.sweep_temps(dest.parent)
    # the photo and its sidecars, each unless the same content is there already
    unit = [(path, key, sha, False)] + [(c, c_key, c_sha, True) for c, c_key, c_sha in sidecars]
    todo = [(f, k, h, comp) for f, k, h, comp in unit if not _present(effects, target.destination(k), h)]
    locations = [str(target.destination(k)) for _, k, _, comp in unit if comp]
    side = {"sidecars": locations} if locations else {}
    if not todo:
        return {"location": str(dest), "key": key, "sha256": sha, "already_present": True, **side}
    for f, k, _, comp in todo:
        taken = target.destination(k)
        if comp and effects.fs.lstat(taken) is not None:  # another sidecar under that key: never clobbered
            raise PhotoError(f, f"conflict: {taken} exists with other content; not overwritten")
    staged = [target.stage(f if comp else pinned.name, k, h, effects.tag) for f, k, h, comp in todo]
    failpoints.hit("upload.after_stage")
    ctx.check()
    intents = effects.record_unit(
        [
            {"kind": "publish", "staged": st, "target": target.destination(k), "source": f, "sha256": h,
             "companion": comp}
            for st, (f, k, h, comp) in zip(staged, todo, strict=True)
        ]
    )  # fmt: skip
    applied = None
    for i, (intent, st, (_, k, h, comp)) in enumerate(zip(intents, staged, todo, strict=True)):
        if i:
            failpoints.hit("upload.between_unit_moves")
        done = effects.apply_and_mark(
            intent, kind="publish", staged=st, target=target.destination(k), source=None, sha256=h,
            companion=comp,
        )  # fmt: skip
        applied = applied or (None if comp else done)
    if applied is None:  # only sidecars were missing: the photo was there already
        return {"location": str(dest), "key": key, "sha256": sha, "already_present": True, **side}
    where = str(Path(applied.target))
    return result_of(applied, location=where, key=key, sha256=sha, already_present=False, **side)


def uploader_metadata(ctx: ItemContext) -> dict[str, str]:
    """The user metadata a new S3 object carries: which job and item uploaded it (an undo deletes
    only an object that still says so; a retry knows the object its killed attempt created)."""
    return {"photojobs-job": str(ctx.lease.job_id), "photojobs-item": str(ctx.item_id)}


def log_uploads(
    ctx: ItemContext, target: S3Target, opts: dict[str, Any], sent: list[tuple[Path, UploadResult, bool]]
) -> None:
    """The effect rows of the item's remote objects, written when the item is marked succeeded
    (``store.history.log_remote`` in its fenced finish): a photo's history lists the upload and
    ``photojobs undo --uploads`` can delete it. ``created`` is False for an object another job
    (or someone else) had put there: undoing this job leaves that object in place."""
    mine = uploader_metadata(ctx)
    name = opts.get("target_name") or parse_target(opts["target"], opts.get("endpoint")).describe()
    rows = []
    for local, result, sidecar in sent:
        full = target.full_key(result.key)
        found = target.stat(full)
        if found is None:
            raise RuntimeError(f"{result.location} vanished right after its upload; retry")
        ours = all(found.metadata.get(k) == v for k, v in mine.items())
        rows.append(RemoteEffect(
            photo_id=ctx.lease.photo_id, kind="upload", from_path=str(local), location=result.location,
            sha256=result.sha256, sidecar=sidecar,
            remote={"target": name, "bucket": target.bucket, "key": full, "etag": found.etag,
                    "size": found.size, "created": (not result.already_present) or ours},
        ))  # fmt: skip
    job, item = ctx.lease.job_id, ctx.item_id
    ctx.at_finish.append(lambda s: log_remote(s, job_id=job, item_id=item, effects=rows))


def sidecar_key(sidecar: Path, photo: Path, key: str) -> str:
    """The key a raw's sidecar is uploaded under: named after the raw's key as it is named after the
    raw (``IMG_0001.CR2.xmp`` -> ``KEY.xmp``, ``IMG_0001.xmp`` -> ``KEY-stem.xmp``)."""
    return str(companion_target(sidecar, photo, PurePosixPath(key)))  # type: ignore[arg-type]


def _present(effects: FileEffects, dest: Path, sha: str) -> bool:
    """The destination holds ``sha`` already (a regular file, read beneath the upload folder)."""
    return fileops.content_sha256(dest, within=effects.fs) == sha
