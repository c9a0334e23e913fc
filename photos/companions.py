"""Which files belong to a photo: its XMP sidecars by name (``NAME.EXT.xmp``, ``NAME.xmp``), which
photo owns a ``STEM.xmp``, and where a sidecar goes when its photo moves -- what a file is, read from
names alone (no metadata is read here; writing a sidecar is :mod:`photos.sidecar`'s)."""

from __future__ import annotations

import os
from pathlib import Path

from photos.formats import is_photo_name
from photos.raw import is_raw

__all__ = [
    "SUFFIX", "changes_an_owner", "companion_target", "companions", "is_sidecar", "new_sidecar", "owner_of",
    "sidecar_of",
]  # fmt: skip

SUFFIX = ".xmp"


def is_sidecar(path: str | os.PathLike[str]) -> bool:
    """True for an XMP sidecar's name (``.xmp``, any case)."""
    return Path(path).suffix.lower() == SUFFIX


def _entries(folder: Path) -> dict[str, str]:
    """The folder's names, case-folded -> as on disk."""
    try:
        return {name.casefold(): name for name in os.listdir(folder)}
    except OSError:
        return {}


def companions(photo: str | os.PathLike[str]) -> list[Path]:
    """The sidecars that belong to ``photo``, as found on disk (any case): ``NAME.EXT.xmp``
    (darktable's, digiKam's default), then ``NAME.xmp`` (Lightroom's, Capture One's) when the photo
    owns it (:func:`owner_of`: a raw of that stem before any other photo, else the first by name).
    Any photo's, not only a raw's: a JPEG, HEIC or AVIF moves with its sidecars the same way."""
    photo = Path(photo)
    wanted = [f"{photo.name}{SUFFIX}"]
    short = f"{photo.stem}{SUFFIX}"
    if short.casefold() != wanted[0].casefold():
        if owner_of(photo.parent / short, set(_entries(photo.parent))) == photo.name.casefold():
            wanted.append(short)
    return _found(photo, wanted)


def _found(photo: Path, wanted_names: list[str]) -> list[Path]:
    names = _entries(photo.parent)
    found = []
    for wanted in wanted_names:
        name = names.get(wanted.casefold())
        # a regular file only: a symlink (perhaps out of the photo roots) is never read or moved
        if name is not None and (photo.parent / name).is_file() and not (photo.parent / name).is_symlink():
            found.append(photo.parent / name)
    return found


def sidecar_of(photo: str | os.PathLike[str]) -> Path | None:
    """The sidecar a photo's (raw or not) metadata is written to now, or None: the first of
    :func:`companions` (``NAME.EXT.xmp``, else a ``NAME.xmp`` the photo owns)."""
    found = companions(photo)
    return found[0] if found else None


def new_sidecar(raw: str | os.PathLike[str]) -> Path:
    """Where a raw without a sidecar gets one: ``IMG_0001.CR2`` -> ``IMG_0001.CR2.xmp``."""
    raw = Path(raw)
    return raw.with_name(f"{raw.name}{SUFFIX}")


def companion_target(companion: Path, photo: Path, new_photo: Path) -> Path:
    """Where ``companion`` (a sidecar of ``photo``) goes when ``photo`` becomes ``new_photo``:
    ``IMG_0001.CR2.xmp`` -> ``NEW.cr2.xmp``, ``IMG_0001.xmp`` -> ``NEW.xmp`` (its suffix's case kept)."""
    suffix = companion.name[len(companion.name) - len(SUFFIX) :]
    if companion.name[: -len(SUFFIX)].casefold() == photo.name.casefold():
        return new_photo.with_name(f"{new_photo.name}{suffix}")
    return new_photo.with_name(f"{new_photo.stem}{suffix}")


def owner_of(sidecar: Path, names: set[str]) -> str | None:
    """The file a sidecar belongs to among ``names`` (case-folded names of its folder): ``X.CR2``
    for ``X.CR2.xmp``; for ``X.xmp`` a raw named ``X.*``, else another photo named ``X.*`` (the
    first by name); None when there is none."""
    body = sidecar.name[: -len(SUFFIX)].casefold()
    if body in names:
        return body
    stem = body + "."
    photos = sorted(n for n in names if n.startswith(stem) and "." not in n[len(stem) :] and is_photo_name(n))
    raws = [n for n in photos if is_raw(n)]
    return (raws or photos or [None])[0]


def changes_an_owner(target: Path, landing: list[Path], leaving: list[Path]) -> bool:
    """Would a photo landing at ``target`` (its sidecars at ``landing``; the files ``leaving`` its
    folder as it goes) change who owns a ``STEM.xmp`` there (:func:`owner_of`)? Its own would belong
    to another photo of that stem (a raw), or another photo's would become its. A move never does:
    the unit takes the next name instead."""
    names = set(_entries(target.parent)) - {f.name.casefold() for f in leaving if f.parent == target.parent}
    short = f"{target.stem}{SUFFIX}".casefold()
    after = names | {target.name.casefold()} | {f.name.casefold() for f in landing}
    if short not in after or short == f"{target.name}{SUFFIX}".casefold():
        return False
    now = owner_of(target.parent / short, after)
    if any(f.name.casefold() == short for f in landing):
        return now != target.name.casefold()
    return short in names and owner_of(target.parent / short, names) != now
