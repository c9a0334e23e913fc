"""Moving a photo to a planned name without clobbering: shared by the rename and archive lanes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.errors import PhotoError
from photos.recovery import link_staged
from photos.rename import resolve_target, with_suffix

from .effects import FileEffects, TargetTaken, result_of

MAX_SUFFIX = 10_000


def move_photo(
    ctx: ItemContext, effects: FileEffects, src: Path, root: Path, relpath: str, notes: list[str]
) -> dict[str, Any]:
    """Move ``src`` to ``root/relpath`` (or the first free ``_N`` suffix), exactly once."""
    effects.sweep_temps(src.parent)  # staged links earlier attempts of this item left
    sha = fileops.sha256_file(src)
    for n in range(MAX_SUFFIX):
        target = resolve_target(root, with_suffix(relpath, n))
        if target == src:
            return {"target": str(src), "unchanged": True, "notes": notes}
        if target.exists():
            continue
        # This attempt's handle on the photo: a hard link next to it (the photo itself where the
        # filesystem has no hard links). Recovery consumes it, so a zombie can never move the photo.
        staged = link_staged(src, effects.tag) or src
        failpoints.hit(f"{ctx.spec.name}.after_stage")  # the plan is made; nothing recorded yet
        try:
            ctx.check()
            intent = effects.record(
                kind="move", staged=staged, target=target, source=src, sha256=sha, base_sha256=sha
            )
        except TargetTaken:
            _drop_link(staged, src)
            continue  # another item reserved this name first: take the next suffix
        except BaseException:
            _drop_link(staged, src)
            raise
        try:
            applied = effects.apply_and_mark(
                intent, kind="move", staged=staged, target=target, source=src, sha256=sha
            )
        except FileExistsError:
            effects.discard(intent, "move", staged, target, f"{target} appeared meanwhile", source=src)
            continue
        return result_of(applied, suffix=n, notes=notes, sha256=sha)
    raise PhotoError(src, f"no free name for {relpath} after {MAX_SUFFIX} suffixes")


def _drop_link(staged: Path, src: Path) -> None:
    if staged != src:
        staged.unlink(missing_ok=True)
