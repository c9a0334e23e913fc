"""The ``exif`` lane: write metadata through exiftool (only the asked tags change, the file time is
kept), replacing the photo in place exactly once. A camera raw is never written: its metadata goes
to its XMP sidecar (``photos.sidecar``), written under the same intent protocol. Any other photo
that has a sidecar (``NAME.EXT.xmp`` or ``NAME.xmp``) gets the same edit in its sidecar: the photo
and its sidecar are recorded as one unit (both intents in one transaction), so a recovering attempt
finishes both or neither and the two never disagree."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.containment import pin_inside
from photos.errors import PhotoError
from photos.exif import ExifEdit, write_metadata
from photos.raw import is_raw
from photos.rename import taken_now
from photos.sidecar import sidecar_of, write_sidecar

from .common import params, photo_path, readable_roots
from .effects import FileEffects, result_of
from .lane import lane_actor


def edit_photo(ctx: ItemContext) -> dict[str, Any]:
    """One exif item: the photo (and its sidecar) edited once, or a raw's sidecar written."""
    effects = FileEffects(ctx)
    recovered = effects.recover()
    if recovered:
        return result_of(recovered[-1])
    path = photo_path(ctx)
    effects.sweep_temps(path.parent)
    edit_params = params(ctx)
    edit = ExifEdit.from_params(edit_params)  # analysis results stay in the store, not in the photo
    if is_raw(path):
        return _raw_sidecar(ctx, effects, path, edit, sorted(edit_params))
    # exiftool and Pillow read exactly the inode checked here (never a symlink swapped in later),
    # and the base the intent records is that inode's content; the edited copy is written into the
    # photo's folder opened beneath its root (exiftool writes through /proc/<pid>/fd of it)
    sidecar: tuple[Path, bytes | None, bytes | None] | None = None
    staged = fileops.staged_path(path, effects.tag)
    with pin_inside(path, readable_roots(ctx) or None, resolve_roots=False) as pinned:
        failpoints.hit("exif.after_check")
        before = pinned.sha256()
        with effects.fs.opendir(path.parent) as folder, pinned.as_photo():
            # the folder by its descriptor (for exiftool too: /proc/<pid>, not its own /proc/self)
            held = Path(f"/proc/{os.getpid()}/fd/{folder.fd}") / staged.name
            written = write_metadata(pinned.name, held, edit)
            try:
                if sidecar_of(path) is not None:  # the sidecar gets the same edit (never created here)
                    sidecar = write_sidecar(path, edit, read_raw=pinned.name)
                # a shift records the capture time the edit gives (read from the staged result)
                moved = {"taken": taken_now(held)} if edit.shift else {}
            except BaseException:
                folder.delete(staged.name, missing_ok=True)
                raise
    staged_sidecar = None
    try:
        if sidecar is not None and sidecar[1] is not None and sidecar[1] != sidecar[2]:
            staged_sidecar = fileops.stage_bytes(sidecar[0], effects.tag, sidecar[1], within=effects.fs)
        failpoints.hit("exif.after_stage")
        if not pinned.still_at():  # what is at the path now is not the photo that was edited
            raise PhotoError(path, "was replaced while its metadata was written; nothing was written")
        ctx.check()  # last safe point: nothing recorded yet
        after = fileops.content_sha256(staged, within=effects.fs)
        if after is None:
            raise PhotoError(path, "its edited copy is gone or out of reach; nothing was written")
        photo_effect = {
            "kind": "replace", "staged": staged, "target": path, "source": path, "sha256": after,
            "base_sha256": before,
        }  # fmt: skip
        unit = [photo_effect]
        if staged_sidecar is not None and sidecar is not None and sidecar[1] is not None:
            target, content, side_before = sidecar
            side_after = hashlib.sha256(content).hexdigest()
            side_base = hashlib.sha256(side_before).hexdigest() if side_before is not None else None
            unit.append({
                "kind": "replace", "staged": staged_sidecar, "target": target, "source": None,
                "sha256": side_after, "base_sha256": side_base, "companion": True,
            })  # fmt: skip
        # keeping the displaced original may refuse (a history store that is a symlink): untouched
        intents = effects.record_unit(unit)  # a photo and its sidecar: one unit, both or none
    except BaseException:
        effects.drop(staged)
        if staged_sidecar is not None:
            effects.drop(staged_sidecar)
        raise
    # The photo first, then its sidecar: once the photo's edit landed, a stopped item's sidecar is
    # finished by the sweeper too (store.intents: a unit lands whole); a sidecar applied first and
    # the item stopped before the photo's apply left the photo's intent discarded, and the next
    # attempt took the applied sidecar for the whole edit (the photo never edited; photo chaos)
    applied = effects.apply_and_mark(
        intents[0], kind="replace", staged=staged, target=path, source=path, sha256=after
    )
    extra: dict[str, Any] = {}
    if len(unit) == 2:
        side = unit[1]
        effects.apply_and_mark(
            intents[1], kind="replace", staged=side["staged"], target=side["target"], source=None,
            sha256=side["sha256"], companion=True,
        )  # fmt: skip
        extra = {"sidecar": str(side["target"]), "sidecar_sha256": side["sha256"]}
    return result_of(
        applied, sha256_before=before, sha256=after, fields=sorted(edit_params), **moved, **extra,
        **written.result(),
    )  # fmt: skip


exif = lane_actor("exif")(edit_photo)


def _raw_sidecar(
    ctx: ItemContext, effects: FileEffects, raw: Path, edit: ExifEdit, fields: list[str]
) -> dict[str, Any]:
    """A raw's edit goes to its XMP sidecar (updated in place, or created next to it), exactly once;
    the raw itself stays byte-identical."""
    # the raw's own bytes (its capture time for a shift) are read from the inode checked here
    with pin_inside(raw, readable_roots(ctx) or None, resolve_roots=False) as pinned, pinned.as_photo():
        failpoints.hit("exif.after_check")
        raw_sha = pinned.sha256()
        target, content, before = write_sidecar(raw, edit, read_raw=pinned.name)
    if content is None or content == before:
        return {"target": str(target), "unchanged": True, "sidecar": str(target), "fields": fields}
    effects.sweep_temps(target.parent)
    staged = fileops.stage_bytes(target, effects.tag, content, within=effects.fs)
    failpoints.hit("exif.after_stage")
    kind = "replace" if before is not None else "publish"  # a new sidecar never clobbers a file
    after = hashlib.sha256(content).hexdigest()
    base = hashlib.sha256(before).hexdigest() if before is not None else None
    try:
        if not pinned.still_at():  # the raw at the path is not the one whose time was read
            raise PhotoError(raw, "was replaced while its sidecar was written; nothing was written")
        ctx.check()  # last safe point: nothing recorded yet
        intent = effects.record(
            kind=kind, staged=staged, target=target, source=None, sha256=after, base_sha256=base,
            companion=True,
        )  # fmt: skip
    except BaseException:
        effects.drop(staged)
        raise
    applied = effects.apply_and_mark(
        intent, kind=kind, staged=staged, target=target, source=None, sha256=after, companion=True
    )
    # never expected: nothing here opens the raw for writing
    if fileops.sha256_file(raw, roots=readable_roots(ctx) or None) != raw_sha:
        raise PhotoError(raw, "the raw changed while its sidecar was written")
    moved = {"taken": taken_now(raw)} if edit.shift else {}
    return result_of(
        applied, sidecar=str(target), sha256=raw_sha, sidecar_sha256=after, fields=fields, **moved
    )
