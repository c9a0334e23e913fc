"""Moving a photo to a planned name without clobbering: shared by the rename and archive lanes.

A raw moves with its XMP sidecars as one unit (``photos.sidecar.companions``): one intent per file,
all recorded in one fenced transaction, applied photo first; recovery and the sweeper finish the
sidecars' moves once the photo's landed (both or neither)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops
from photos.errors import PhotoError
from photos.recovery import link_staged
from photos.rename import resolve_target, with_suffix
from photos.sidecar import companion_target, companions

from .effects import FileEffects, TargetTaken, result_of

MAX_SUFFIX = 10_000


def move_photo(
    ctx: ItemContext, effects: FileEffects, src: Path, root: Path, relpath: str, notes: list[str]
) -> dict[str, Any]:
    """Move ``src`` to ``root/relpath`` (or the first free ``_N`` suffix), exactly once."""
    effects.sweep_temps(src.parent)  # staged links earlier attempts of this item left
    sha = fileops.sha256_file(src)
    sidecars = [(c, fileops.sha256_file(c)) for c in companions(src)]
    for n in range(MAX_SUFFIX):
        target = resolve_target(root, with_suffix(relpath, n))
        if target == src:
            return {"target": str(src), "unchanged": True, "notes": notes}
        moves = [(src, target, sha, False)] + [
            (c, companion_target(c, src, target), c_sha, True) for c, c_sha in sidecars
        ]
        if any(t.exists() for _, t, _, _ in moves):
            continue  # the photo's name or one of its sidecars' is taken: the unit takes the next
        # This attempt's handle on each file: a hard link next to it (the file itself where the
        # filesystem has no hard links). Recovery consumes it, so a zombie can never move the photo.
        staged = [link_staged(f, effects.tag) or f for f, _, _, _ in moves]
        failpoints.hit(f"{ctx.spec.name}.after_stage")  # the plan is made; nothing recorded yet
        try:
            ctx.check()
            intents = effects.record_unit(
                [
                    {"kind": "move", "staged": st, "target": t, "source": f, "sha256": h, "base_sha256": h,
                     "companion": comp}
                    for st, (f, t, h, comp) in zip(staged, moves, strict=True)
                ]
            )  # fmt: skip
        except TargetTaken:
            _drop_links(staged, moves)
            continue  # another item reserved this name first: take the next suffix
        except BaseException:
            _drop_links(staged, moves)
            raise
        try:
            applied = effects.apply_and_mark(
                intents[0], kind="move", staged=staged[0], target=target, source=src, sha256=sha
            )
        except FileExistsError:
            for i, st, (f, t, _, comp) in zip(intents, staged, moves, strict=True):
                effects.discard(i, "move", st, t, f"{target} appeared meanwhile", source=f, companion=comp)
            continue
        moved = []
        for i, st, (f, t, h, _) in zip(intents[1:], staged[1:], moves[1:], strict=True):
            failpoints.hit(f"{ctx.spec.name}.between_unit_moves")  # the photo moved, a sidecar not yet
            try:
                effects.apply_and_mark(
                    i, kind="move", staged=st, target=t, source=f, sha256=h, companion=True
                )
            except FileExistsError:  # a file took the sidecar's new name meanwhile: never clobbered
                effects.discard(i, "move", st, t, f"{t} appeared meanwhile", source=f, companion=True)
                raise PhotoError(
                    f, f"moved {src} to {target}, but {t} appeared meanwhile; the sidecar stays at {f}"
                ) from None
            moved.append(str(t))
        extra = {"sidecars": moved} if moved else {}
        return result_of(applied, suffix=n, notes=notes, sha256=sha, **extra)
    raise PhotoError(src, f"no free name for {relpath} after {MAX_SUFFIX} suffixes")


def _drop_links(staged: list[Path], moves: list[tuple[Path, Path, str, bool]]) -> None:
    for st, (f, _, _, _) in zip(staged, moves, strict=True):
        if st != f:
            st.unlink(missing_ok=True)
