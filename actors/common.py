"""Small helpers shared by the photo lanes: the photo, its root, its facts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from middleware.context import ItemContext
from photos.analyze import analyze
from photos.errors import PhotoError
from photos.params import lane_params
from store.intents import photo_facts


def photo_path(ctx: ItemContext) -> Path:
    if not ctx.photo_path:
        raise PhotoError(None, f"item {ctx.item_id} names no photo")
    path = Path(ctx.photo_path)
    if not path.exists():
        raise PhotoError(path, "file not found (deleted or moved after submission)")
    return path


def photo_root(ctx: ItemContext, path: Path) -> Path:
    """The deepest root the job was given that contains the photo."""
    roots = sorted((Path(r) for r in ctx.lease.roots), key=lambda p: len(p.parts), reverse=True)
    for root in roots:
        if path == root or root in path.parents:
            return root
    raise PhotoError(path, f"outside the job's roots {[str(r) for r in roots]}")


def facts_for(ctx: ItemContext, path: Path) -> dict[str, Any]:
    """This job's analysis facts for the photo, or a fresh analysis when the job has none; with
    ``file_time`` (the file's modification time recorded at submission) when the store has it."""
    facts = photo_facts(ctx.engine, ctx.lease.job_id, ctx.lease.photo_id)
    if facts and facts.get("sha256"):
        return facts
    fresh = analyze(path)
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
