"""The ``rename`` lane: a pattern of capture time and camera, collision-free, never clobbering."""

from __future__ import annotations

from typing import Any

from middleware.context import ItemContext
from photos.params import DEFAULT_RENAME_PATTERN
from photos.rename import render

from .common import facts_for, fallback_time, params, photo_path, photo_root
from .effects import FileEffects
from .lane import lane_actor
from .moves import move_photo


@lane_actor("rename")
def rename(ctx: ItemContext) -> dict[str, Any]:
    effects = FileEffects(ctx)
    recovered = effects.recover()
    if recovered:
        return {"target": recovered[-1].target, "recovered": True}
    path = photo_path(ctx)
    root = photo_root(ctx, path)
    facts = facts_for(ctx, path)
    pattern = params(ctx).get("pattern", DEFAULT_RENAME_PATTERN)
    rendered = render(pattern, facts, path, fallback_time(facts, path))
    result = move_photo(ctx, effects, path, root, rendered.relpath, rendered.notes)
    if rendered.taken_from is not None:
        result["taken_from"] = rendered.taken_from
    return result
