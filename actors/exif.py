"""The ``exif`` lane: write metadata through exiftool (only the asked tags change, the file time is
kept), replacing the photo in place exactly once."""

from __future__ import annotations

from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.exif import ExifEdit, write_metadata
from photos.rename import taken_now

from .common import params, photo_path
from .effects import FileEffects, result_of
from .lane import lane_actor


@lane_actor("exif")
def exif(ctx: ItemContext) -> dict[str, Any]:
    effects = FileEffects(ctx)
    recovered = effects.recover()
    if recovered:
        return result_of(recovered[-1])
    path = photo_path(ctx)
    effects.sweep_temps(path.parent)
    edit_params = params(ctx)
    edit = ExifEdit.from_params(edit_params)  # analysis results stay in the store, not in the photo
    before = fileops.sha256_file(path)
    staged = fileops.staged_path(path, effects.tag)
    write_metadata(path, staged, edit)
    failpoints.hit("exif.after_stage")
    try:
        ctx.check()  # last safe point: nothing recorded yet
    except BaseException:
        staged.unlink(missing_ok=True)
        raise
    after = fileops.sha256_file(staged)
    intent = effects.record(
        kind="replace", staged=staged, target=path, source=path, sha256=after, base_sha256=before
    )
    applied = effects.apply_and_mark(
        intent, kind="replace", staged=staged, target=path, source=path, sha256=after
    )
    # a shift records the capture time the photo has now (later lanes read the same from the file)
    moved = {"taken": taken_now(path)} if edit.shift else {}
    return result_of(applied, sha256_before=before, sha256=after, fields=sorted(edit_params), **moved)
