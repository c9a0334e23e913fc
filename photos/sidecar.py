"""XMP sidecars: where a raw's metadata goes, which sidecar belongs to which photo, and which files
move with a photo.

A raw is never written. Its keywords, rating, description, artist, copyright and a time shift go to
an XMP sidecar next to it, in the places :mod:`photos.exif` writes XMP (``dc:subject``,
``lr:hierarchicalSubject``, ``xmp:Rating``, ``dc:description``, ``dc:creator``, ``dc:rights``; a
shift moves every date the sidecar holds (``exif:DateTimeOriginal``, ``xmp:CreateDate``,
``photoshop:DateCreated``, … as :func:`photos.clocks.clock_args` does for a file), and a sidecar
without ``exif:DateTimeOriginal`` gets the raw's, shifted):

- an existing sidecar is updated: ``IMG_0001.CR2.xmp`` (darktable, digiKam's default) if there is
  one, else ``IMG_0001.xmp`` (Lightroom, Capture One, digiKam's "commercial programs" mode);
  keywords are added to its own, every other tag in it is kept;
- a raw without one gets ``IMG_0001.CR2.xmp``: the name darktable and digiKam read and write, and
  the only one that cannot be shared by the two halves of a RAW+JPEG pair (``IMG_0001.CR2`` and
  ``IMG_0001.JPG`` would both claim ``IMG_0001.xmp``).

Any other photo (JPEG, HEIC, …) may have a sidecar too, by the same two names: ``IMG_0002.JPG.xmp``
(darktable) or ``IMG_0002.xmp`` (Lightroom, Capture One) -- the latter only when no raw shares the
stem (a RAW+JPEG pair's ``IMG_0001.xmp`` is the raw's, as Lightroom has it; of several other photos
sharing a stem, the first by name; :func:`sidecar_of`). An edit of such a photo writes its sidecar
too, so the two never disagree (``actors/exif.py``); a photo without one gets none.

Both names travel with their photo as one unit (:func:`companions`): a rename, an archive move or
an upload takes the photo and its sidecars together, renamed to the photo's new name — a raw's, and
any other photo's the same way (a darktable ``IMG_0002.JPG.xmp``, a Lightroom ``IMG_0002.xmp``
beside a JPEG, HEIC or AVIF). A move never changes which photo a ``STEM.xmp`` belongs to
(:func:`changes_an_owner`).
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from photos import exiftool
from photos.companions import (  # re-exported: where a photo's sidecars are
    SUFFIX,
    changes_an_owner,
    companion_target,
    companions,
    is_sidecar,
    new_sidecar,
    owner_of,
    sidecar_of,
)
from photos.errors import NeedsExiftool, PhotoError
from photos.exif import ExifEdit, exiftool_args, read_warnings
from photos.exiftool_messages import classify
from photos.keywords import KEYWORD_TAGS
from photos.raw import is_raw, iso_time
from photos.raw_clocks import RAW_CLOCKS, raw_clock_args

__all__ = [  # where a photo's sidecars are (photos.companions), and writing them
    "SUFFIX", "changes_an_owner", "companion_target", "companions", "is_sidecar", "new_sidecar", "owner_of",
    "read_sidecar", "sidecar_of", "write_sidecar",
]  # fmt: skip
_DT = "%Y:%m:%d %H:%M:%S"
_STATE_TAGS = ("-XMP-x:XMPToolkit", *KEYWORD_TAGS, "-XMP-exif:DateTimeOriginal")


def _tool(path: Path) -> exiftool.ExifTool:
    if not exiftool.available():
        raise NeedsExiftool(path, f"writing a raw's XMP sidecar needs exiftool ({exiftool.INSTALL_HINT})")
    return exiftool.ExifTool.shared()


def _record(tool: exiftool.ExifTool, path: Path, *tags: str, written: bool = True) -> dict[str, Any]:
    """``-j -G1 -a`` of ``tags``. exiftool's warnings refuse as for any write
    (:mod:`photos.exiftool_messages`); a file that is ``written=False`` (the raw, read for its
    capture time only) is refused only for a serious one."""
    out, warnings = tool.execute_with_warnings(
        "-j", "-G1", "-a", *tags, os.path.abspath(path), retry_if_died=True
    )
    said = classify([*warnings, *read_warnings(tool, path)], os.path.abspath(path))
    refusal = said.refusal() if written else "; ".join(said.serious)
    if refusal:
        raise PhotoError(path, f"exiftool warned, nothing written: {refusal}")
    try:
        records = json.loads(out, parse_int=str, parse_float=str) if out.strip() else [{}]
        record = dict(records[0])
    except (ValueError, IndexError, TypeError) as exc:
        raise PhotoError(path, "exiftool gave unreadable output for the file") from exc
    record.pop("SourceFile", None)
    return record


def _raw_taken_shifted(raw: Path, shift: timedelta, tool: exiftool.ExifTool, read_raw: Path | None) -> str:
    """The raw's own capture time moved by ``shift`` (for a sidecar that has none yet)."""
    record = _record(tool, read_raw or raw, "-EXIF:DateTimeOriginal", *raw_clock_args(), written=False)
    keys = ("ExifIFD:DateTimeOriginal", "IFD0:DateTimeOriginal", *(key for _, key in RAW_CLOCKS))
    value = next((record[k] for k in keys if record.get(k) not in (None, "")), None)
    if not value:
        raise PhotoError(raw, "cannot shift the capture time: the raw has no DateTimeOriginal")
    text = str(value).strip()
    try:
        taken = datetime.strptime(text[:19].replace("-", ":").replace("T", " "), _DT)
    except ValueError:
        raise PhotoError(raw, "cannot shift the capture time: DateTimeOriginal is not a date/time") from None
    return (taken + shift).strftime(_DT) + text[19:]


def write_sidecar(
    photo: str | os.PathLike[str], edit: ExifEdit, *, read_raw: str | os.PathLike[str] | None = None
) -> tuple[Path, bytes | None, bytes | None]:
    """The sidecar ``edit`` produces for ``photo`` (a raw, or any photo that has a sidecar):
    ``(its path, its new content, its content now)`` (None: no sidecar; the two equal: nothing to
    change). Nothing is written: the caller stages and applies it (a raw itself is never opened for
    writing). Keywords merge with the sidecar's own; its other content is kept (exiftool edits the
    XMP packet in place); a shift moves every date it holds. A raw without a sidecar gets a new
    one; another photo without one gets none (``(path, None, None)``). ``read_raw`` is the name
    the photo's own bytes are read through (the exif lane's pinned, checked inode)."""
    photo = Path(photo)
    if not photo.is_file():
        raise PhotoError(photo, "file not found (deleted or moved after submission)")
    existing = sidecar_of(photo)
    target = existing or new_sidecar(photo)
    if existing is None and not is_raw(photo):
        return target, None, None
    tool = _tool(photo)
    current = _record(tool, existing, *_STATE_TAGS) if existing else {}
    clocks = _record(tool, existing, "-time:all") if existing and edit.shift else {}
    args = exiftool_args(edit, fmt="XMP", current=current, path=target, clocks=clocks)
    if edit.shift and is_raw(photo) and not current.get("XMP-exif:DateTimeOriginal"):
        shifted = _raw_taken_shifted(photo, edit.shift, tool, Path(read_raw) if read_raw else None)
        args.append(f"-XMP-exif:DateTimeOriginal={shifted}")
        if not any(a.startswith("-XMP-x:XMPToolkit") for a in args):
            toolkit = current.get("XMP-x:XMPToolkit")
            args.append(f"-XMP-x:XMPToolkit={toolkit}" if toolkit else "-XMP-x:XMPToolkit=")
    before = existing.read_bytes() if existing else None
    if not args:  # nothing to change: no sidecar is created, an existing one stays as it is
        return target, before, before
    with exiftool.private_folder("pj-xmp-") as tmp:
        out = Path(tmp) / "sidecar.xmp"
        source = [os.path.abspath(existing)] if existing else []
        try:
            _, warnings = tool.execute_with_warnings(
                "-ec", *args, "-o", str(out), *source, retry_if_died=True
            )
        except PhotoError as exc:
            raise PhotoError(target, f"cannot write the XMP sidecar: {exc.reason}") from exc
        refusal = classify(warnings, *source).refusal()
        if refusal:
            raise PhotoError(target, f"exiftool warned, nothing written: {refusal}")
        if not out.is_file():
            raise PhotoError(target, "exiftool reported success but wrote no sidecar")
        return target, out.read_bytes(), before


def read_sidecar(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What a sidecar says, as photo apps read it: ``keywords`` (list), ``hierarchical`` (list),
    ``description``, ``rating``, ``artist``, ``copyright``, ``taken`` (ISO, a shifted time)."""
    path = Path(path)
    tool = _tool(path)
    out = tool.execute(
        "-j", "-struct", "-n", "-XMP-dc:Subject", "-XMP-lr:HierarchicalSubject", "-XMP-dc:Description",
        "-XMP-xmp:Rating", "-XMP-dc:Creator", "-XMP-dc:Rights", "-XMP-exif:DateTimeOriginal",
        os.path.abspath(path), retry_if_died=True,
    )  # fmt: skip
    try:
        record = json.loads(out, parse_int=str, parse_float=str)[0] if out.strip() else {}
    except (ValueError, IndexError) as exc:
        raise PhotoError(path, "exiftool gave unreadable output for the sidecar") from exc

    def listed(value: Any) -> list[str]:
        return (
            [] if value in (None, "") else [str(v) for v in (value if isinstance(value, list) else [value])]
        )

    def text(value: Any) -> str | None:
        if isinstance(value, dict):
            value = value.get("x-default") or next(iter(value.values()), None)
        if isinstance(value, list):
            value = "; ".join(map(str, value))
        return str(value) if value not in (None, "") else None

    rating = record.get("Rating")
    taken = text(record.get("DateTimeOriginal"))
    return {
        "keywords": listed(record.get("Subject")),
        "hierarchical": listed(record.get("HierarchicalSubject")),
        "description": text(record.get("Description")),
        "rating": int(float(rating)) if rating not in (None, "") else None,
        "artist": text(record.get("Creator")),
        "copyright": text(record.get("Rights")),
        "taken": iso_time(taken) if taken else None,
    }
