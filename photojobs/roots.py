"""Photo roots: the folders a web submission may name (``PHOTOJOBS_PHOTO_ROOTS``, ``:``-separated).

A path is refused (``OutsideRoots``, HTTP 403) when it has a ``..`` part, is absolute and not under
a root, or resolves (through symlinks) outside every root — checked for the paths given and again
for every file found under them, before anything is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path, PurePosixPath

from store.errors import SubmissionError

ROOTS_ENV = "PHOTOJOBS_PHOTO_ROOTS"


class OutsideRoots(SubmissionError):
    """A submitted path lies outside the configured photo roots."""

    def __init__(self, path: str, why: str) -> None:
        self.path = path
        super().__init__(f"{path}: {why}")


def parse_roots(text: str | None) -> list[Path]:
    """``"/photos:/mnt/more"`` -> the roots as given, made absolute (empty parts ignored)."""
    return [Path(part).expanduser().absolute() for part in (text or "").split(":") if part.strip()]


def _within(p: Path, roots: Iterable[Path]) -> bool:
    return any(p == r or p.is_relative_to(r) for r in roots)


def confine(paths: Sequence[str], roots: Sequence[Path]) -> list[str]:
    """The submitted paths as absolute paths inside ``roots``; a relative path is taken relative to
    the first root. Raises ``OutsideRoots`` or ``SubmissionError`` (empty path, no roots)."""
    if not roots:
        raise OutsideRoots(
            ", ".join(paths) or "(no paths)",
            f"no photo roots are configured; set {ROOTS_ENV} to the folders jobs may use",
        )
    resolved_roots = [r.resolve() for r in roots]
    out = []
    for raw in paths:
        if not isinstance(raw, str) or not raw.strip():
            raise SubmissionError("an empty path was given")
        if "\x00" in raw:
            raise SubmissionError(f"{raw!r}: a path cannot contain a NUL byte")
        if ".." in PurePosixPath(raw).parts:
            raise OutsideRoots(raw, "'..' is not allowed in a submitted path")
        p = Path(raw).expanduser()
        p = p if p.is_absolute() else roots[0] / p
        if not _within(p, roots) and not _within(p, resolved_roots):
            raise OutsideRoots(raw, f"not inside the photo roots ({':'.join(str(r) for r in roots)})")
        if p.exists() and not _within(p.resolve(), resolved_roots):
            raise OutsideRoots(raw, "resolves (through a symlink) outside the photo roots")
        out.append(str(p))
    return out


def check_found(photos: Iterable[Path], roots: Sequence[Path]) -> None:
    """Every file found under the submitted folders must resolve inside a root (a symlink inside a
    root may point anywhere)."""
    resolved_roots = [r.resolve() for r in roots]
    for photo in photos:
        if not _within(photo.resolve(), resolved_roots):
            raise OutsideRoots(str(photo), "resolves (through a symlink) outside the photo roots")
