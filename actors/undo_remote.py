"""Undo of an upload to an S3-compatible target (``photojobs undo JOB --uploads``).

A remote upload is no intent: its effect row (``effect`` ``remote``) names the object the job left —
target, bucket, key, ETag, size, and whether the job created it — and is logged when the upload item
succeeded (``actors.upload.log_uploads``). Its undo, per photo (the photo's object and its sidecars'
as one unit):

1. refuses the whole unit, deleting nothing, when a later job uploaded the same key and its effect
   is still in effect ("undo it first"), or when an object is not the one the job uploaded
   (:func:`remote_changed`: another ETag, size, content hash, or another uploader in its metadata —
   "changed since … outside photojobs", never deleted), or is gone without this item having
   deleted it;
2. records which effects it is about to delete in the item's checkpoint, fenced: a worker that lost
   its lease (frozen, partitioned) gets ``StaleLease`` there and deletes nothing;
3. deletes each object only while its ETag is still the recorded one (``If-Match``): a delete is
   idempotent, and a retried attempt that finds an object gone that the checkpoint names knows its
   earlier attempt deleted it;
4. logs the undo rows (``store.history.log_remote``: ``upload removed``, or ``upload left in place``
   for an object the job found there already) in the fenced transaction that marks the item
   succeeded, so a retried item reports each removal once.

The target is the undone job's own (its ``upload.target``/``upload.endpoint``: the operator's, from
``PHOTOJOBS_UPLOAD_TARGETS`` or the command line), and every object must lie under it: an effect row
never sends a request anywhere else. The local photo and its sidecars are never touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos.errors import PhotoError
from photos.upload import RemoteObject, S3Target, parse_target
from store import history as log
from store.history import Effect, RemoteEffect, log_remote

from .common import params

DELETING = "undo_remote_deleting"  # checkpoint key: the effect ids this item deletes


def remote_changed(r: Effect, have: RemoteObject) -> str | None:
    """Why the stored object is not the one effect ``r`` uploaded, or None when it still is: the
    one check before a remote copy is deleted (a copy changed since is never deleted)."""
    want = r.remote or {}
    if have.etag != want.get("etag"):
        return f"has ETag {have.etag}, job {r.job_id} left {want.get('etag')}"
    if have.size != want.get("size"):
        return f"holds {have.size} bytes, job {r.job_id} left {want.get('size')}"
    if have.metadata.get("sha256") != r.after_sha256:
        return f"says sha256 {have.metadata.get('sha256')}, job {r.job_id} left {r.after_sha256}"
    uploader = (have.metadata.get("photojobs-job"), have.metadata.get("photojobs-item"))
    if uploader != (str(r.job_id), str(r.item_id)):
        return f"was put there by another writer (job {uploader[0]}, item {uploader[1]})"
    return None


def undo_remote(ctx: ItemContext, job: int, rows: list[Effect]) -> dict[str, Any]:
    """Reverse the remote upload effects ``rows`` of job ``job`` on this item's photo."""
    changed = f"changed since job {job}"
    redo = [r for r in rows if r.undoes is not None]
    if redo:
        raise PhotoError(
            None,
            f"job {job} deleted the remote copy {redo[0].to_path}; an undo does not upload it again "
            "(run the upload again)",
        )
    target = _target(ctx, rows)
    saved = dict(ctx.saved_checkpoint or {})
    deleting = {int(i) for i in saved.get(DELETING, [])}
    unit = sorted(rows, key=lambda r: (r.sidecar, r.id))
    plan: list[tuple[Effect, str]] = []
    for r in unit:
        later = [e for e in log.later_at(ctx.engine, r.to_path, r.id) if e.job_id != job and e.undoes is None]
        if later:
            e = later[0]
            raise PhotoError(
                None,
                f"{changed} by job {e.job_id}'s upload of {r.to_path} (undo it first: "
                f"photojobs undo {e.job_id} --uploads)",
            )
        if not (r.remote or {}).get("created"):
            plan.append((r, "left"))  # there before the job: it stays
            continue
        have = target.stat(_key(r))
        if have is None:
            if r.id in deleting:
                plan.append((r, "removed"))  # this item's earlier attempt deleted it
                continue
            raise PhotoError(None, f"{changed} outside photojobs: {r.to_path} is gone")
        why = remote_changed(r, have)
        if why is not None:
            raise PhotoError(None, f"{changed} outside photojobs: {r.to_path} {why}; not deleted")
        plan.append((r, "delete"))
    doomed = [r.id for r, what in plan if what == "delete"]
    if doomed:
        ctx.check()
        ctx.checkpoint({**saved, DELETING: sorted(deleting | set(doomed))})  # fenced: StaleLease if lost
        failpoints.hit("undo.upload.after_record")
    for r, what in plan:
        if what == "delete" and not target.delete_if(_key(r), str((r.remote or {})["etag"])):
            raise PhotoError(
                None, f"{changed} outside photojobs: {r.to_path} was replaced meanwhile; not deleted"
            )
    failpoints.hit("undo.upload.after_apply")
    effects = [
        RemoteEffect(
            photo_id=r.photo_id, kind="upload left in place" if what == "left" else "upload removed",
            from_path=r.to_path, location=r.to_path, sha256=r.after_sha256,
            remote={**(r.remote or {}), "deleted": what != "left"}, sidecar=r.sidecar, undoes=r.id,
        )
        for r, what in plan
    ]  # fmt: skip
    me, item = ctx.lease.job_id, ctx.item_id
    ctx.at_finish.append(lambda s: log_remote(s, job_id=me, item_id=item, effects=effects))
    return {
        "undone": len(plan),
        "job": job,
        "effects": [r.id for r in unit],
        "removed": [r.to_path for r, what in plan if what != "left"],
        "left": [r.to_path for r, what in plan if what == "left"],
    }


def _key(r: Effect) -> str:
    return str((r.remote or {})["key"])


def _target(ctx: ItemContext, rows: list[Effect]) -> S3Target:
    """The undone job's own S3 target (the operator's), which every object must lie under."""
    opts = params(ctx)
    spec = parse_target(str(opts.get("target") or ""), opts.get("endpoint"))
    if spec.kind != "s3":
        raise PhotoError(None, f"the job's upload target {spec.describe()} is not an S3 target")
    target = spec.connect()
    if not isinstance(target, S3Target):
        raise RuntimeError("internal error: expected an S3 target")
    for r in rows:
        remote = r.remote or {}
        key = str(remote.get("key") or "")
        inside = not target.prefix or key.startswith(target.prefix + "/")
        if remote.get("bucket") != target.bucket or not inside or r.to_path != f"s3://{target.bucket}/{key}":
            raise PhotoError(
                Path(r.to_path), f"is not under the job's upload target {spec.describe()}; not deleted"
            )
    return target
