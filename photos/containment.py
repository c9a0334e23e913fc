"""Root containment, the one implementation: does a path, with every symlink resolved, lie inside a root.

Used at submission (``photojobs.roots``: the paths and destinations a job names) and at the moment
of use (the lanes: the photo they open, the folder they write into, a rename's target). Errors never
say where an outside path leads nor what it holds.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from photos.errors import OutsideRoot

PHOTO_ROOTS = "the photo roots"


def is_within(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> bool:
    """``path`` is one of ``roots`` or below one, compared as written (no symlink is resolved)."""
    p = Path(path)
    return any(p == Path(r) or p.is_relative_to(Path(r)) for r in roots)


def real_roots(roots: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The roots with their symlinks resolved (a root that is itself a symlink is allowed)."""
    return [Path(r).expanduser().resolve() for r in roots]


def resolve_inside(
    path: str | os.PathLike[str],
    roots: Sequence[str | os.PathLike[str]],
    *,
    what: str = PHOTO_ROOTS,
    resolve_roots: bool = True,
) -> Path:
    """The real path of ``path`` (every symlink resolved, relative to the working directory) when it
    is inside one of ``roots``; else :class:`OutsideRoot` saying it is "outside ``what``".

    ``resolve_roots=False`` compares against the roots as given: for roots recorded already resolved
    (a job's roots), so that a root swapped for a symlink later does not carry its files along.
    """
    if not roots:
        raise OutsideRoot(path, f"outside {what}: no roots are known")
    real = Path(path).expanduser().resolve()
    allowed = real_roots(roots) if resolve_roots else [Path(r) for r in roots]
    if not is_within(real, allowed):
        raise OutsideRoot(path, f"resolves outside {what}")
    return real


def open_inside(
    path: str | os.PathLike[str],
    roots: Sequence[str | os.PathLike[str]],
    *,
    what: str = PHOTO_ROOTS,
    resolve_roots: bool = True,
) -> int:
    """Open ``path`` read-only and return the descriptor, checking the file actually opened: where
    the kernel says the descriptor points (``/proc/self/fd``) must be inside ``roots``. A symlink
    swapped in after any earlier check is caught here, before a byte is read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    try:
        link = f"/proc/self/fd/{fd}"
        real = Path(os.readlink(link)) if os.path.exists(link) else Path(path).resolve()
        allowed = real_roots(roots) if resolve_roots else [Path(r) for r in roots]
        if not roots or not is_within(real, allowed):
            raise OutsideRoot(path, f"resolves outside {what}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_relative(root: str | os.PathLike[str], relpath: str) -> Path:
    """``root / relpath`` with its existing parents resolved, the final name kept (a symlink there
    must point inside ``root`` too); :class:`OutsideRoot` if it leaves the resolved ``root``."""
    real_root = Path(root).expanduser().resolve()
    candidate = real_root / relpath
    parent = candidate.parent.resolve()
    if not is_within(parent, [real_root]):
        raise OutsideRoot(relpath, f"resolves to {parent}, which is outside the root {real_root}")
    target = parent / candidate.name
    if target.is_symlink() and not is_within(pointed := target.resolve(), [real_root]):
        raise OutsideRoot(relpath, f"is a symlink to {pointed}, which is outside the root {real_root}")
    return target
