"""The ``analysis`` lane: real facts about each photo (no file is changed)."""

from __future__ import annotations

from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos.analyze import DEFAULT_MAX_PIXELS, analyze
from photos.containment import pin_inside
from store.intents import set_photo_hash

from .common import params, photo_path, readable_roots
from .lane import lane_actor


def analyse_photo(ctx: ItemContext) -> dict[str, Any]:
    """One analysis item (the lane's work, without Dramatiq: the actor ``analysis`` runs it)."""
    path = photo_path(ctx, pinned=True)  # confined by the pin's own check of what it opens
    # Every byte analysed (Pillow, exiftool, LibRaw) is read from the inode checked here, through
    # its descriptor: a symlink swapped in at the photo's path afterwards is never read.
    with pin_inside(path, readable_roots(ctx) or None, resolve_roots=False) as pinned:
        failpoints.hit("analysis.after_check")
        ctx.check()
        with pinned.as_photo():
            facts = analyze(
                pinned.name, max_pixels=int(params(ctx).get("max_pixels", DEFAULT_MAX_PIXELS)), located=path
            )
    ctx.check()
    photo_id = ctx.lease.photo_id
    if photo_id is not None:  # recorded in the same commit as the item's success
        ctx.at_finish.append(lambda s: set_photo_hash(s, photo_id, facts["sha256"], facts.get("file_size")))
    return facts


analysis = lane_actor("analysis")(analyse_photo)
