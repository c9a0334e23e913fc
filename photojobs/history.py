"""Per-photo history and undo for the client, the command and the web API (issue 31).

The store keeps the effect log (``store.history``); the workers reverse effects (``actors.undo``);
this module plans and submits an undo job, answers a photo's history by id or path, and prunes the
displaced originals kept for undo (``PHOTOJOBS_HISTORY_KEEP``, default 30 days).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from photojobs.doorbell import ring_sweepers
from photos import history as kept_files
from photos.errors import OutsideRoot
from photos.params import job_roots
from photos.recovery import content_of
from photos.rootfs import Roots
from store import history as store_history
from store import jobs as store_jobs
from store import way_back
from store.errors import StoreError
from store.intents import stray_roots
from store.retention import parse_age

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from photojobs.api import Client

KEEP_ENV = "PHOTOJOBS_HISTORY_KEEP"
DEFAULT_KEEP = "30d"


class UnknownPhoto(StoreError):
    def __init__(self, photo: int | str) -> None:
        self.photo = photo
        super().__init__(f"no photo {photo!r} is known to photojobs (give its id or its current path)")


def photo_history(
    engine: Engine, photo: int | str, *, limit: int = store_history.HISTORY_PAGE, after: int | None = None
) -> dict[str, Any]:
    """A page of a photo's history by id (an int, or a string of digits that is not a file) or path:
    ``limit`` entries after effect ``after``, and ``next`` to continue from (None on the last page)."""
    photo_id: int | None
    if isinstance(photo, int):
        photo_id = photo
    elif photo.isdigit() and not Path(photo).exists():
        photo_id = int(photo)
    else:
        photo_id = store_history.find_photo(engine, str(Path(photo).expanduser().resolve()))
        photo_id = photo_id if photo_id is not None else store_history.find_photo(engine, photo)
    found = None
    if photo_id is not None:
        found = store_history.photo_history(engine, photo_id, limit=limit, after=after)
    if found is None:
        raise UnknownPhoto(photo)
    return found


def submit_undo(
    client: Client,
    job_id: int,
    *,
    lane: str | None,
    uploads: bool,
    photos: Iterable[str] | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Plan the undo of ``job_id`` (only the photos at the current paths ``photos`` when given:
    ``store.history.NotInJob`` names each path that is no photo of the job) and submit it; with
    ``dry_run`` the plan per photo (``store.way_back.preview``), nothing changed or submitted."""
    chosen = None if photos is None else [_current_path(p) for p in photos]
    plan = store_history.plan_undo(client.engine, job_id, lane=lane, uploads=uploads, photos=chosen or None)
    if dry_run:
        return way_back.preview(client.engine, plan)
    if not plan.lanes or not plan.paths:
        return {"job": None, "items": 0, "note": plan.note}
    submitted = store_jobs.submit(
        client.engine,
        [client.specs[n] for n in plan.lanes],
        [store_jobs.PhotoInput(p) for p in plan.paths],
        params=plan.params,
        roots=plan.roots,
    )
    ring_sweepers(client.settings.redis_url)
    return {"job": submitted.job_id, "items": submitted.items, **({"note": plan.note} if plan.note else {})}


def submit_restore(
    client: Client, photo: int | str, *, to_effect: int | None = None, before_job: int | None = None
) -> dict[str, Any]:
    """Submit a job that brings back a kept version of one photo (``store.history.plan_restore``)
    over what it holds now: ``{"job", "items", "sha256", "version"}``; ``{"job": None, "note"}``
    when it holds that version already. ``UnknownPhoto``; ``ValueError`` naming why not."""
    found = photo_history(client.engine, photo, limit=1)
    plan = store_history.plan_restore(
        client.engine, found["photo"], to_effect=to_effect, before_job=before_job
    )
    # the kept version's job's roots, its archive root and upload folder: where the photo may be now
    roots = [str(r) for r in job_roots(plan.roots, plan.params)]
    with Roots(roots) as fs:  # read beneath the roots, as the worker then acts
        try:
            fs.lstat(plan.path)
        except OutsideRoot as exc:
            raise ValueError(f"{plan.path} is not beneath the roots of its kept version: {exc}") from None
        have = content_of(plan.path, within=fs)
    if have == plan.sha256:
        return {"job": None, "items": 0, "note": f"{plan.path} holds {plan.label} already"}
    submitted = store_jobs.submit(
        client.engine,
        [client.specs["exif"]],
        [store_jobs.PhotoInput(plan.path)],
        params={store_history.RESTORE_FROM: plan.source},
        roots=roots,
    )
    ring_sweepers(client.settings.redis_url)
    return {"job": submitted.job_id, "items": submitted.items, "sha256": plan.sha256, "version": plan.label}


def _current_path(photo: str) -> str:
    """A photo's current path as the store records it: absolute, its folders' symlinks resolved."""
    if not photo or "\x00" in photo:
        raise ValueError(f"not a photo path: {photo!r}")
    return str(Path(photo).expanduser().resolve())


def keep_seconds(client: Client, keep: float | str | None = None) -> float:
    if keep is None:
        keep = client.settings.env.get(KEEP_ENV) or DEFAULT_KEEP
    return parse_age(keep) if isinstance(keep, str) else float(keep)


def prune_history(client: Client, keep: float | str | None = None) -> int:
    """Remove the kept originals whose every effect is older than the retention; the effect rows
    stay (history), marked as no longer kept (their undo then says so). Returns files removed."""
    seconds = keep_seconds(client, keep)
    stores = {Path(p).parent.parent for p in store_history.kept_paths(client.engine)}
    stores |= {kept_files.store_for(r) for r in stray_roots(client.engine)}
    removed = 0
    while True:
        batch = store_history.expired_kept(client.engine, seconds)
        if not batch:
            break
        removed += len(kept_files.prune([p for _, p in batch], keep_paths=set()))
        store_history.forget_kept(client.engine, [i for ids, _ in batch for i in ids])
    # Kept for an edit that never landed (discarded, or its worker died before recording it): named
    # by no effect and no live intent, older than the retention.
    named = store_history.kept_paths(client.engine)
    for store in sorted(stores):
        removed += len(kept_files.sweep_unreferenced(store, named, seconds))
    return removed
