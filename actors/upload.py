"""The ``upload`` lane: to a local folder (staged + no-clobber publish) or S3 (conditional, resumable)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.upload import LocalTarget, S3Target, object_key, parse_target

from .common import destination_root, facts_for, fallback_time, params, photo_path, readable_roots
from .effects import FileEffects, result_of
from .lane import lane_actor


@lane_actor("upload")
def upload(ctx: ItemContext) -> dict[str, Any]:
    opts = params(ctx)
    spec = parse_target(opts["target"], opts.get("endpoint"))
    if spec.kind == "local":  # the folder written into, re-checked at the moment of use
        spec = replace(spec, root=destination_root(ctx, spec.root or opts["target"]))
    effects = FileEffects(ctx)
    if spec.kind == "local":
        recovered = effects.recover()
        if recovered:
            return result_of(recovered[-1])
    path = photo_path(ctx)
    facts = facts_for(ctx, path)
    # hashed through a descriptor checked inside the roots: the copy and the S3 checksum verify it
    sha = fileops.sha256_file(path, roots=readable_roots(ctx) or None)
    facts = {**facts, "sha256": sha}
    key = object_key(opts.get("key"), facts, path, fallback_time(facts, path))
    target = spec.connect()
    if isinstance(target, S3Target):
        ctx.check()
        result = target.upload(
            path, key, sha, checkpoint=ctx.saved_checkpoint, save_checkpoint=ctx.checkpoint
        )
        return {
            "location": result.location,
            "key": result.key,
            "sha256": sha,
            "already_present": result.already_present,
        }
    assert isinstance(target, LocalTarget)
    dest = target.destination(key)
    effects.sweep_temps(dest.parent)
    if dest.exists() and fileops.sha256_file(dest) == sha:
        return {"location": str(dest), "key": key, "sha256": sha, "already_present": True}
    staged = target.stage(path, key, sha, effects.tag)
    failpoints.hit("upload.after_stage")
    ctx.check()
    intent = effects.record(kind="publish", staged=staged, target=dest, source=path, sha256=sha)
    applied = effects.apply_and_mark(
        intent, kind="publish", staged=staged, target=dest, source=None, sha256=sha
    )
    return result_of(applied, location=str(Path(applied.target)), key=key, sha256=sha, already_present=False)
