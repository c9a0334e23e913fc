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
    if ctx.lease.photo_id is not None:
        with ctx.fenced("photo hash") as s:
            set_photo_hash(s, ctx.lease.photo_id, facts["sha256"], facts.get("file_size"))
    return facts
