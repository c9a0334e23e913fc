"""The ``archive`` lane: move originals into dated folders under the archive root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from middleware.context import ItemContext
from photos.archive import archive_relpath
from photos.errors import PhotoError

from .common import facts_for, params, photo_path, photo_root
from .effects import FileEffects
from .lane import lane_actor
from .moves import move_photo


@lane_actor("archive")
def archive(ctx: ItemContext) -> dict[str, Any]:
    effects = FileEffects(ctx)
    recovered = effects.recover()
    if recovered:
        return {"target": recovered[-1].target, "recovered": True}
    path = photo_path(ctx)
    opts = params(ctx)
    if opts.get("bundle", "none") != "none":
        raise PhotoError(path, f"archive.bundle={opts['bundle']} is not supported by this version")
    root = Path(opts["root"])
    facts = facts_for(ctx, path)
    relpath = archive_relpath(facts, path, path.stat().st_mtime)
    root.mkdir(parents=True, exist_ok=True)
    result = move_photo(ctx, effects, path, root, relpath, [])
    prune_empty_dirs(path.parent, photo_root(ctx, path))
    return result


def prune_empty_dirs(folder: Path, stop: Path) -> None:
    """Remove folders the move left empty (e.g. a rename's dated folders), up to the photo's root."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
