"""Moving a photo to a planned name without clobbering: shared by the rename and archive lanes.

A photo moves with its XMP sidecars as one unit (``photos.sidecar.companions``: a raw's, a JPEG's,
any photo's ``NAME.EXT.xmp`` and ``NAME.xmp``): one intent per file,
all recorded in one fenced transaction, applied photo first; recovery and the sweeper finish the
sidecars' moves once the photo's landed (both or neither)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext
from photos import fileops, rootfs
from photos.containment import Pinned, pin_inside
from photos.errors import PhotoError
from photos.recovery import link_staged
from photos.rename import resolve_target, with_suffix
from photos.sidecar import changes_an_owner, companion_target, companions
from store.sidecar_moves import moving_elsewhere

from .common import readable_roots
from .effects import FileEffects, TargetTaken, result_of

MAX_SUFFIX = 10_000
REPLACED = "was replaced or removed since it was checked; not moved"


def move_photo(
    ctx: ItemContext,
    effects: FileEffects,
    src: Path,
    root: Path,
    relpath: str,
    notes: list[str],
    *,
    first_suffix: int = 0,
) -> dict[str, Any]:
    """Move ``src`` to ``root/relpath`` (or the first free ``_N`` suffix from ``first_suffix``: a
    burst's shot its place), exactly once.

    The photo is pinned (``containment.pin_inside``) before anything is read: it is hashed through
    the checked descriptor, its staged link is made from that descriptor (so a symlink swapped in
    at ``src`` is never what moves), and a ``src`` that no longer is what was pinned is not moved."""
    effects.sweep_temps(src.parent)  # staged links earlier attempts of this item left
    with pin_inside(src, readable_roots(ctx) or None, resolve_roots=False) as pinned:
        failpoints.hit(f"{ctx.spec.name}.after_check")
        return _move_pinned(ctx, effects, pinned, root, relpath, notes, first_suffix)


def _move_pinned(
    ctx: ItemContext,
    effects: FileEffects,
    pinned: Pinned,
    root: Path,
    relpath: str,
    notes: list[str],
    first_suffix: int = 0,
) -> dict[str, Any]:
    src = pinned.path
    sha = pinned.sha256()
    roots = readable_roots(ctx) or None
    found = companions(src)
    busy = moving_elsewhere(ctx.engine, [str(c) for c in found], ctx.item_id) if found else set()
    # a sidecar another unit is moving (a raw landed, its NAME.xmp not yet) is not this photo's
    sidecars = [(c, fileops.sha256_file(c, roots=roots)) for c in found if str(c) not in busy]
    for n in range(first_suffix, MAX_SUFFIX):
        target = resolve_target(root, with_suffix(relpath, n))
        if target == src:
            return {"target": str(src), "unchanged": True, "notes": notes}
        moves = [(src, target, sha, False)] + [
            (c, companion_target(c, src, target), c_sha, True) for c, c_sha in sidecars
        ]
        if any(t.exists() for _, t, _, _ in moves) or changes_an_owner(
            target, [t for _, t, _, _ in moves[1:]], [f for f, _, _, _ in moves]
        ):
            continue  # a name of the unit is taken (or a sidecar there would change owner): the next
        # This attempt's handle on each file: a hard link next to it (the file itself where the
        # filesystem has no hard links). Recovery consumes it, so a zombie can never move the photo.
        staged = [_link_pinned(pinned, effects)]
        staged += [link_staged(f, effects.tag, within=effects.fs) or f for f, *_ in moves[1:]]
        failpoints.hit(f"{ctx.spec.name}.after_stage")  # the plan is made; nothing recorded yet
        try:
            if not pinned.still_at():
                raise PhotoError(src, REPLACED)
            ctx.check()
            intents = effects.record_unit(
                [
                    {"kind": "move", "staged": st, "target": t, "source": f, "sha256": h, "base_sha256": h,
                     "companion": comp}
                    for st, (f, t, h, comp) in zip(staged, moves, strict=True)
                ]
            )  # fmt: skip
        except TargetTaken:
            _drop_links(effects, staged, moves)
            continue  # another item reserved this name first: take the next suffix
        except BaseException:
            _drop_links(effects, staged, moves)
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


def _link_pinned(pinned: Pinned, effects: FileEffects) -> Path:
    """This attempt's staged hard link of the pinned photo, made from its descriptor in its folder
    opened beneath its root: the checked file, never a symlink swapped in at its path nor a folder
    swapped in above it; the photo's own name where the filesystem has no hard links."""
    if not pinned.still_at():
        raise PhotoError(pinned.path, REPLACED)
    staged = fileops.staged_path(pinned.path, effects.tag)
    with effects.fs.folder_of(staged) as (folder, name):
        folder.delete(name, missing_ok=True)
        try:
            rootfs.link_open_file(pinned.fd, folder, name)
        except OSError as exc:
            if exc.errno in rootfs.NO_LINK_ERRNOS:
                return pinned.path
            if exc.errno == errno.ENOENT:  # the file lost its last name since it was checked
                raise PhotoError(pinned.path, REPLACED) from None
            raise
        folder.fsync()
    return staged


def _drop_links(effects: FileEffects, staged: list[Path], moves: list[tuple[Path, Path, str, bool]]) -> None:
    for st, (f, _, _, _) in zip(staged, moves, strict=True):
        if st != f:
            effects.drop(st)
