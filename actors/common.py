"""Small helpers shared by the photo lanes: the photo, its root, its facts."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos.analyze import header_facts
from photos.containment import pin_inside, resolve_inside
from photos.errors import PhotoError
from photos.params import ALLOWED_ROOTS_KEY, lane_params
from photos.params import job_roots as roots_of_job
from photos.rename import capture_taken_now
from photos.rootfs import Roots, ensure_folder
from store.intents import photo_facts

DESTINATION_ROOTS = "the photo roots and output roots the job was given"


def photo_path(ctx: ItemContext, *, pinned: bool = False) -> Path:
    """The item's photo, checked at the moment of use: it exists and, with every symlink resolved,
    lies inside the job's roots (or its archive root), else the item fails "outside the photo
    roots" before a byte of it is read.

    ``pinned``: the caller reads it only through ``pin_inside`` with :func:`readable_roots`, whose
    open checks where the descriptor leads — the same check, on the file actually opened. A path
    that is a regular file itself (not a symlink, which is resolved here as ever) is then returned
    after one ``lstat``: resolving each of its folders first would only repeat that check."""
    if not ctx.photo_path:
        raise PhotoError(None, f"item {ctx.item_id} names no photo")
    path = Path(ctx.photo_path)
    if pinned:
        try:
            if stat.S_ISREG(os.lstat(path).st_mode):
                return path
        except OSError:
            pass  # missing or unreadable: said below, as for any lane
    if not path.exists() and not path.is_symlink():
        raise PhotoError(path, "file not found (deleted or moved after submission)")
    check_photo(ctx, path)
    if not path.exists():
        raise PhotoError(path, "file not found (deleted or moved after submission)")
    return path


def readable_roots(ctx: ItemContext) -> list[Path]:
    """Where the job's photos may be: its roots (recorded resolved at submission) and, once the
    archive lane moved them, its archive root."""
    roots = [Path(r) for r in ctx.lease.roots]
    archive = ctx.params.get("archive.root")
    if isinstance(archive, str) and archive:
        confined = ALLOWED_ROOTS_KEY in ctx.params
        roots.append(Path(archive) if confined else Path(archive).expanduser().resolve())
    return roots


def job_roots(ctx: ItemContext) -> Roots:
    """The folders the item's file effects may change, each acted on beneath its descriptor
    (``photos.rootfs``): the job's photo roots, its archive root, its local upload folder."""
    return Roots(roots_of_job(ctx.lease.roots, ctx.params))


def make_destination(ctx: ItemContext, folder: Path) -> None:
    """Make the folder a lane writes into (an archive root, an upload folder) when missing: beneath
    the roots a confined job was given, no symlink followed; an unconfined job's where it was told."""
    allowed = ctx.params.get(ALLOWED_ROOTS_KEY)
    ensure_folder(folder, None if allowed is None else [Path(r) for r in allowed])


def check_photo(ctx: ItemContext, path: Path) -> Path:
    """``path``'s real path when it lies inside :func:`readable_roots`; ``OutsideRoot`` otherwise."""
    roots = readable_roots(ctx)
    if not roots:
        return path
    return resolve_inside(path, roots, resolve_roots=False)


def destination_root(ctx: ItemContext, folder: str | Path) -> Path:
    """The folder a lane writes into (upload target, archive root), checked at the moment of use: for
    a job confined at submission it must resolve inside the photo and output roots it recorded, and
    its real path is returned; an unconfined (operator's CLI) job writes where it was told."""
    allowed = ctx.params.get(ALLOWED_ROOTS_KEY)
    if allowed is None:
        return Path(folder)
    return resolve_inside(folder, allowed, what=DESTINATION_ROOTS, resolve_roots=False)


def photo_root(ctx: ItemContext, path: Path) -> Path:
    """The deepest root the job was given that contains the photo; it must still be a real folder
    (a root swapped for a symlink would carry a rename out of it)."""
    roots = sorted((Path(r) for r in ctx.lease.roots), key=lambda p: len(p.parts), reverse=True)
    for root in roots:
        if path == root or root in path.parents:
            resolve_inside(root, [root], resolve_roots=False)
            return root
    raise PhotoError(path, f"outside the job's roots {[str(r) for r in roots]}")


def facts_for(ctx: ItemContext, path: Path) -> dict[str, Any]:
    """This job's analysis facts for the photo, or its header facts when the job has none (no pixel
    is decoded: a photo nothing decodes is still renamed, uploaded and archived); with
    ``file_time`` (the file's modification time recorded at submission) when the store has it and
    the capture time read from the file now (``taken``, ``taken_subsec``, ``taken_from``: every
    source of ``photos.capture_time``, so names agree with an earlier lane's time shift)."""
    facts = photo_facts(ctx.engine, ctx.lease.job_id, ctx.lease.photo_id)
    # read through a descriptor checked inside the roots (a symlink swapped in is never read); a
    # photo's sidecars are found next to it, at its real path
    with pin_inside(path, readable_roots(ctx) or None, resolve_roots=False) as pinned, pinned.as_photo():
        failpoints.hit(f"{ctx.spec.name}.facts_after_check")
        if facts and facts.get("sha256"):
            # one clock per photo: the capture time the file has now (after an exif shift), not at analysis
            now = capture_taken_now(pinned.name, default=facts.get("taken"), located=path)
            return {**facts, **now.facts()}
        fresh = header_facts(pinned.name, located=path)
    if facts and facts.get("file_time") is not None:
        fresh["file_time"] = facts["file_time"]
    return fresh


def fallback_time(facts: dict[str, Any], path: Path) -> float:
    """The time a photo without a capture time is named after: the file time recorded at submission
    (stable across later edits), else (photos recorded before revision 0003) the file's mtime now."""
    file_time = facts.get("file_time")
    return float(file_time) if file_time is not None else path.stat().st_mtime


def params(ctx: ItemContext) -> dict[str, Any]:
    return lane_params(ctx.params, ctx.spec.name)
