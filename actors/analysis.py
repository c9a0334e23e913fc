"""The ``analysis`` lane: real facts about each photo (no file is changed)."""

from __future__ import annotations

from typing import Any

from middleware.context import ItemContext
from photos.analyze import DEFAULT_MAX_PIXELS, analyze
from store.intents import set_photo_hash

from .common import params, photo_path
from .lane import lane_actor


@lane_actor("analysis")
def analysis(ctx: ItemContext) -> dict[str, Any]:
    path = photo_path(ctx)
    ctx.check()
    facts = analyze(path, max_pixels=int(params(ctx).get("max_pixels", DEFAULT_MAX_PIXELS)))
    ctx.check()
    photo_id = ctx.lease.photo_id
    if photo_id is not None:  # recorded in the same commit as the item's success
        ctx.at_finish.append(lambda s: set_photo_hash(s, photo_id, facts["sha256"], facts.get("file_size")))
    return facts
