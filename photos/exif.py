"""Metadata writing through exiftool: keywords, description, rating, artist, copyright, time shift.

:func:`write_metadata` writes an edited copy of ``src`` to ``dst`` (a staged temp path chosen by
the caller) with one command to the worker's persistent exiftool process (``-o dst src``, ``-P``
so the copy keeps the file's modification time). ``src`` is never modified. exiftool edits the
metadata blocks in place of the file structure: pixels, the JPEG scan data, MakerNotes (their
offsets fixed), thumbnails, unterminated or misplaced tags and everything else that was not asked
for stay as they were. (piexif is not used: it re-serialises the whole EXIF block, which drops
EXIF tags stored in IFD0, the Interop IFD and uncompressed thumbnails and cuts unterminated
ASCII values.)

Where each field goes (what Lightroom, digiKam, Immich, Photos and Windows read), only where the
file already speaks: EXIF only into a file that has an EXIF block, IPTC only in JPEG and TIFF, XMP
always (no EXIF block, no IFD0 resolution, no time zone is ever invented). The formats and what
each carries: :mod:`photos.formats` (JPEG, TIFF, PNG, HEIF, AVIF, WebP, JPEG XL).

==============  ============================================================================
keywords        added to the file's own (``keywords_remove`` takes out, ``keywords_mode=replace``
                replaces), compared case-insensitively; the XMP list is the truth, XMP-dc:Subject,
                IPTC:Keywords and EXIF:XPKeywords are written from it; a hierarchical ``a|b|c``
                also in XMP-lr:HierarchicalSubject (its leaf ``c`` in the flat lists); see
                :mod:`photos.keywords`
description     XMP-dc:Description, IPTC:Caption-Abstract, EXIF:ImageDescription
rating          XMP-xmp:Rating; EXIF:Rating (+ EXIF:RatingPercent) where the file has one
artist          XMP-dc:Creator, IPTC:By-line, EXIF:Artist
copyright       XMP-dc:Rights, IPTC:CopyrightNotice, EXIF:Copyright
shift           every clock exiftool reads and can write (``-time:all``): EXIF IFD0/ExifIFD/IFD1,
                XMP, IPTC pairs, PNG, QuickTime, maker notes (see :mod:`photos.clocks`); not GPS
                (UTC), ICC or file system times
==============  ============================================================================

IPTC is written as UTF-8 (an older block is converted, :mod:`photos.iptc`) and its ``IPTCDigest``
renewed where the file has one; IPTC length limits cut only the IPTC copy. An XMP toolkit stamp is
never added or changed.

Errors: missing/empty/non-image input, or an image Pillow cannot decode -> UnreadableImage;
exiftool missing -> NeedsExiftool naming the install command; an exiftool error or a serious
warning about the file (reading or writing, classified one way: :mod:`photos.exiftool_messages`)
-> PhotoError naming the file (the staged output is removed). A ``[minor]`` warning exiftool
fixed, and a clock exiftool cannot write, are reported in the :class:`Written` result instead.
:func:`read_metadata` reads the fields back through exiftool.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from photos import exiftool
from photos.clocks import ENCODING_CLOCKS, MAX_SHIFT, clock_args, name_of, parse_shift, shifted_tags
from photos.errors import InvalidParameter, NeedsExiftool, PhotoError
from photos.exiftool_messages import Messages, classify
from photos.formats import (
    IPTC_FORMATS,
    check_complete,
    check_decodes,
    format_of,
    is_jxl_codestream,
    jpeg_scan_data,
    read_source,
    sniff_format,
)
from photos.iptc import charset_args, iptc_cut, reread_as_utf8, source_charset
from photos.keywords import (
    HIERARCHY,
    KEYWORD_MODES,
    KEYWORD_TAGS,
    beyond_ucs2,
    clean_keywords,
    existing,
    file_keywords,
    has_control,
    in_group,
    keyword_writes,
)
from photos.verify import STRUCTURAL, drop_jbrd, has_jbrd, verify_written

__all__ = [
    "HIERARCHY",
    "IPTC_FORMATS",
    "KEYWORD_MODES",
    "ExifEdit",
    "Written",
    "check_decodes",
    "clock_args",
    "exiftool_args",
    "jpeg_scan_data",
    "name_of",
    "parse_shift",
    "read_metadata",
    "sniff_format",
    "write_metadata",
]

_EXIF_DT_FORMAT = "%Y:%m:%d %H:%M:%S"
_RATING_PERCENT = {0: 0, 1: 1, 2: 25, 3: 50, 4: 75, 5: 99}
_EDITABLE = (
    "keywords", "keywords_remove", "keywords_mode", "description", "rating", "artist", "copyright", "shift"
)
#: What the result records when a JPEG XL's JPEG reconstruction data was dropped (photos.verify).
JBRD_DROPPED = (
    "Dropped the JPEG XL's JPEG reconstruction data (jbrd box), which no longer matched the edited "
    "metadata: the codestream is unchanged (libjxl decodes it itself instead of rebuilding a JPEG)"
)
_INSTALL = "make installs the pinned ExifTool; or apt-get install libimage-exiftool-perl"


@dataclass
class ExifEdit:
    """What to change. ``None`` leaves a field as it is; ``""`` clears a text field.

    ``keywords`` are added to the file's keywords (its order kept, no duplicates, compared
    case-insensitively: the first spelling is kept) and ``keywords_remove`` taken out; with
    ``keywords_mode="replace"`` the file's keywords become exactly ``keywords`` (``[]`` clears
    them). A keyword may be hierarchical (``Places|Ireland|Dublin``). No ``;`` or control
    characters in a keyword. ``rating`` is 0-5; ``shift`` moves every clock the photo carries (see
    :func:`photos.clocks.clock_args`).
    """

    keywords: list[str] | None = None
    keywords_remove: list[str] | None = None
    keywords_mode: str = "add"
    description: str | None = None
    rating: int | None = None
    artist: str | None = None
    copyright: str | None = None
    shift: timedelta | None = None

    def __post_init__(self) -> None:
        if self.keywords is not None:
            self.keywords = clean_keywords("keywords", self.keywords)
        if self.keywords_remove is not None:
            self.keywords_remove = clean_keywords("keywords_remove", self.keywords_remove)
        if self.keywords_mode not in KEYWORD_MODES:
            raise InvalidParameter(
                f"keywords_mode must be one of {', '.join(KEYWORD_MODES)}, got {self.keywords_mode!r}"
            )
        if self.keywords_mode == "replace" and self.keywords_remove:
            raise InvalidParameter("keywords_remove has no meaning with keywords_mode=replace")
        for name in ("description", "artist", "copyright"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or has_control(value, allow_newline=True)):
                raise InvalidParameter(f"{name} must be text without control characters, got {value!r}")
        if self.rating is not None and (
            isinstance(self.rating, bool) or not isinstance(self.rating, int) or not 0 <= self.rating <= 5
        ):
            raise InvalidParameter(f"rating must be an integer 0-5, got {self.rating!r}")
        if isinstance(self.shift, str):
            self.shift = parse_shift(self.shift)
        if self.shift is not None and (
            not isinstance(self.shift, timedelta) or abs(self.shift) > MAX_SHIFT or self.shift.microseconds
        ):
            raise InvalidParameter(
                f"shift must be a whole-second timedelta within 200 years, got {self.shift!r}"
            )

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ExifEdit:
        """Build from job parameters (``shift`` may be a string such as ``"+1h"``)."""
        unknown = sorted(set(params) - set(_EDITABLE))
        if unknown:
            raise InvalidParameter(f"unknown metadata parameter(s) {unknown}; valid: {list(_EDITABLE)}")
        return cls(**dict(params))

    def is_empty(self) -> bool:
        """True when the edit changes nothing."""
        others = (getattr(self, f.name) for f in fields(self) if f.name not in ("shift", "keywords_mode"))
        return not self.shift and all(value is None for value in others)


@dataclass
class Written:
    """What a write reports beside the file: the ``[minor]`` warnings exiftool fixed by itself
    (``fixed``), the clocks it reads but cannot write, left as they were (``unshifted``), and the
    other ``[minor]`` warnings it wrote through (``warned``; :mod:`photos.exiftool_messages`)."""

    fixed: list[str] = field(default_factory=list)
    unshifted: list[str] = field(default_factory=list)
    warned: list[str] = field(default_factory=list)
    xp_left_out: list[str] = field(default_factory=list)

    def result(self) -> dict[str, list[str]]:
        """The item-result fields (only those that say something)."""
        out: dict[str, list[str]] = {}
        if self.fixed:
            out["exiftool_fixed"] = list(self.fixed)
        if self.unshifted:
            out["unshifted"] = list(self.unshifted)
        if self.warned:
            out["exiftool_warned"] = list(self.warned)
        if self.xp_left_out:
            out["xpkeywords_left_out"] = list(self.xp_left_out)
        return out


# -- writing -------------------------------------------------------------------------------------
def write_metadata(src: str | os.PathLike[str], dst: str | os.PathLike[str], edit: ExifEdit) -> Written:
    """Write a copy of ``src`` with ``edit`` applied to ``dst`` (replaced if it exists), fsynced,
    with the modification time of ``src``; return what exiftool fixed or could not shift.

    Only the asked tags change (see the module docstring). Raises UnreadableImage for missing,
    empty or non-image input, NeedsExiftool when exiftool is missing, PhotoError when exiftool
    reports an error or a serious warning for the file or a date cannot be shifted; ``dst`` is
    then absent.

    ``dst``'s folder must exist; everything is written into it through its descriptor, never
    through a name planted at ``dst`` (the exif lane names the photo's folder as
    ``/proc/<pid>/fd/<n>`` of a folder it holds open beneath its root, so nothing is written
    through a folder swapped for a symlink either).
    """
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise PhotoError(src, "write_metadata needs a separate destination; the source is never modified")
    data = read_source(src)
    fmt = format_of(src, data)
    check_complete(src, fmt, data)  # exiftool edits metadata without reading the image data
    codestream = fmt == "JXL" and is_jxl_codestream(data[:2])
    jbrd = fmt == "JXL" and has_jbrd(data)
    # the original's pixels, for the formats whose written copy is verified by decoding it again
    src_pixels = check_decodes(src, digest=fmt not in STRUCTURAL)
    if not exiftool.available():
        raise NeedsExiftool(src, f"writing {fmt} metadata needs exiftool ({_INSTALL})")
    _unlink_quietly(dst)  # exiftool -o refuses an existing output; dst is the caller's staged path
    tool = exiftool.ExifTool.shared()
    src_abs = os.path.abspath(src)
    read = Messages()
    current = _current_tags(tool, src, read) if not edit.is_empty() else {}
    clocks = _clock_tags(tool, src) if edit.shift else {}
    charset = source_charset(tool, src, current) if speaks_iptc(fmt, current) and current else None
    if charset == "UTF8":  # Picasa's undeclared UTF-8: merge keywords with their real text
        others = {k: v for k, v in current.items() if not k.startswith("IPTC:")}
        current = {**others, **reread_as_utf8(tool, src)}
    kept: list[str] = []  # clocks left as they were on purpose (photos.clocks.clock_args)
    args = exiftool_args(
        edit, fmt=fmt, current=current, path=src, clocks=clocks, iptc_charset=charset,
        renew_digest=read.stale_digest, unshifted=kept,
    )  # fmt: skip
    xp_left_out = _xp_left_out(args)
    if args and codestream:
        # a bare JPEG XL codestream holds no metadata: exiftool wraps it in the ISO BMFF container
        # (a "[minor]" error it only does when told to ignore minor errors; the pixels are unchanged)
        args = ["-m", *args]
    if not args:
        _copy_new(src, dst)  # nothing to change: an identical copy, same modification time
        written = Written(fixed=read.fixed, warned=read.recovered, unshifted=kept)
    else:
        warnings = _exiftool_write(tool, src, src_abs, dst, args, drop_jbrd=jbrd)
        said = classify(warnings, src_abs)
        if jbrd and dst.exists():
            said.fixed.append(JBRD_DROPPED)
        shifting = clock_args(edit.shift, clocks, src) if edit.shift else []
        refusal = said.refusal(allowed_unwritable=shifted_tags(shifting))
        if refusal:
            _unlink_quietly(dst)
            raise PhotoError(src, f"exiftool warned, nothing written: {refusal}")
        if not dst.exists():  # every tag asked for was a clock exiftool cannot write
            _copy_new(src, dst)
        written = Written(
            fixed=_merged(read.fixed, said.fixed),
            unshifted=_merged(kept, said.unwritable),
            warned=_merged(read.recovered, said.recovered),
            xp_left_out=xp_left_out,
        )
        try:  # verify before replace: the copy holds the original's picture, and decodes
            verify_written(src, dst, fmt, src_data=data, src_pixels=src_pixels)
        except PhotoError:
            _unlink_quietly(dst)
            raise
        # -P keeps whole seconds only: give the copy the exact times (and the permissions) of the source
        times = src.stat()
        _settle_copy(dst, times)
    _settle_copy(dst, None)
    return written


def _merged(*lists: list[str]) -> list[str]:
    out: list[str] = []
    for items in lists:
        out += [i for i in items if i not in out]
    return out


_OUT_NAMES = itertools.count()


def _exiftool_write(
    tool: exiftool.ExifTool, src: Path, src_abs: str, dst: Path, args: list[str], *, drop_jbrd: bool = False
) -> list[str]:
    """Run exiftool's ``-o`` write of ``src_abs`` to ``dst``; return its warnings (``dst`` is then
    present, to be removed by the caller, or absent when exiftool warned and wrote nothing) or raise
    PhotoError (``dst`` absent).

    exiftool expands ``%d``, ``%f``, ``%e``, ``%c`` (and ``%:9d``-style forms) in its ``-o``
    argument, and ``%%`` does not escape them in 12.57, so ``dst``'s own path -- whose folders and
    name a rename pattern or a photo's name chose -- is never handed to it: exiftool writes into
    ``dst``'s folder through ``/proc/PID/fd/N`` of a descriptor held here (a path of digits only),
    under a name chosen here (the staged-file pattern with ``dst``'s attempt tag, so the item's
    next attempt -- or the sweeper -- removes it if the worker dies before the rename), and the
    result is renamed to ``dst`` within that same folder."""
    folder = os.open(dst.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    name = _exiftool_out_name(dst.name)
    try:
        out = f"/proc/{os.getpid()}/fd/{folder}/{name}"
        try:
            _, warnings = tool.execute_with_warnings(
                "-ec", "-P", *args, "-o", out, src_abs, retry_if_died=True
            )
        except PhotoError as exc:
            _unlink_at(folder, name)
            raise PhotoError(src, exc.reason) from exc
        try:
            if drop_jbrd:
                name = _without_jbrd(src, folder, name)
            os.replace(name, dst.name, src_dir_fd=folder, dst_dir_fd=folder)
        except FileNotFoundError:
            if warnings:
                return warnings  # e.g. only clocks exiftool cannot write were asked for
            raise PhotoError(src, "exiftool reported success but wrote no output file") from None
        return warnings
    finally:
        os.close(folder)


def _without_jbrd(src: Path, folder: int, name: str) -> str:
    """Rewrite exiftool's output ``name`` (in ``folder``) without its ``jbrd`` box; the new name.
    Nothing when exiftool wrote no output (FileNotFoundError, as the caller expects)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=folder)
    with os.fdopen(fd, "rb") as fh:
        data = fh.read()
    try:
        cleaned = drop_jbrd(data)
    except ValueError as exc:
        _unlink_at(folder, name)
        reason = f"cannot drop the JPEG XL reconstruction data: {exc}; nothing was written"
        raise PhotoError(src, reason) from None
    new = name.replace(".exiftool-", ".exiftool-nojbrd-", 1)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(new, flags, 0o600, dir_fd=folder)
    try:
        with os.fdopen(out, "wb") as fh:
            fh.write(cleaned)
    except BaseException:
        _unlink_at(folder, new)
        raise
    finally:
        _unlink_at(folder, name)
    return new


_STAGED_TAG = re.compile(r"\.pj-([A-Za-z0-9_.-]{1,64})\.tmp$")


def _exiftool_out_name(dst_name: str) -> str:
    """exiftool's output name: ``dst``'s attempt tag when ``dst`` is a staged name (so a later
    attempt's ``sweep_temps`` removes what a killed one left), never any of its other characters."""
    found = _STAGED_TAG.search(dst_name)
    tag = found.group(1) if found else f"x{os.getpid()}"
    return f".exiftool-{next(_OUT_NAMES)}.pj-{tag}.tmp"


def _unlink_at(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _unlink_quietly(path: Path) -> None:
    folder = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        _unlink_at(folder, path.name)
    finally:
        os.close(folder)


def _copy_new(src: Path, dst: Path) -> None:
    """An identical copy of ``src`` at the new name ``dst`` (``O_EXCL | O_NOFOLLOW``: never written
    through a name planted there), with its permission bits and times."""
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with open(src, "rb") as fh, os.fdopen(fd, "wb") as out:
        shutil.copyfileobj(fh, out, 1024 * 1024)
        out.flush()
        _settle_copy(out.fileno(), os.fstat(fh.fileno()))


def _settle_copy(dst: Path | int, times: os.stat_result | None) -> None:
    """Give the written copy (a name, opened without following a symlink, or a descriptor) the
    source's permission bits and exact times (``times``), or fsync it (None)."""
    fd = dst if isinstance(dst, int) else os.open(dst, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if times is None:
            os.fsync(fd)
        else:
            os.chmod(fd, stat.S_IMODE(times.st_mode))
            os.utime(fd, ns=(times.st_atime_ns, times.st_mtime_ns))
    finally:
        if not isinstance(dst, int):
            os.close(fd)


_STATE_TAGS = (
    "-XMP-x:XMPToolkit",
    "-IPTC:all",
    *KEYWORD_TAGS,
    "-Photoshop:IPTCDigest",
    "-EXIF:all",
)


def _current_tags(tool: exiftool.ExifTool, path: Path, messages: Messages | None = None) -> dict[str, Any]:
    """The tags a write depends on: the XMP toolkit, the IPTC block, every keyword store, the IPTC
    digest, and the EXIF block (whether the file has one at all). A serious warning refuses the
    file; the ``[minor]`` ones exiftool fixed are added to ``messages.fixed``."""
    # one command: the tags and every warning exiftool has about the file (``-G1:4`` numbers the
    # copies of a tag, so no warning is lost; the first copy of each tag is the one kept)
    # -e: no Composite tags (none is asked for; computing them is a fifth of a read's time)
    out, warnings = tool.execute_with_warnings(
        "-j", "-G1:4", "-a", "-e", *_STATE_TAGS, "-ExifTool:Warning", os.path.abspath(path),
        retry_if_died=True,
    )  # fmt: skip
    record = _json_record(path, out)
    said = classify([*warnings, *_warnings_of(record)], os.path.abspath(path))
    refusal = said.refusal()
    if refusal:  # e.g. "Bad IFD0 directory": what the file says cannot be read, so nothing is written
        raise PhotoError(path, f"exiftool warned, nothing written: {refusal}")
    if messages is not None:
        messages.fixed += [w for w in said.fixed if w not in messages.fixed]
        messages.recovered += [w for w in said.recovered if w not in messages.recovered]
        messages.stale_digest = messages.stale_digest or said.stale_digest
    return _first_copies(record)


def _warnings_of(record: Mapping[str, Any]) -> list[str]:
    return [str(v) for k, v in record.items() if k.split(":")[0] == "ExifTool" and k.endswith(":Warning")]


def _first_copies(record: Mapping[str, Any]) -> dict[str, Any]:
    """A ``-G1:4`` record as ``-G1`` names its tags (``GROUP:TAG``): the first copy of each kept, the
    warnings dropped."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        parts = key.split(":")
        if parts[0] == "ExifTool" and parts[-1] == "Warning":
            continue
        out.setdefault(f"{parts[0]}:{parts[-1]}", value)
    return out


def read_warnings(tool: exiftool.ExifTool, path: Path) -> list[str]:
    """Every warning exiftool has about the file when it reads it (reading reports them as
    ``ExifTool:Warning`` tags, not on stderr; ``-G1:4`` numbers the copies so none is lost)."""
    out = tool.execute("-j", "-G1:4", "-a", "-ExifTool:Warning", os.path.abspath(path), retry_if_died=True)
    return _warnings_of(_json_record(path, out))


def _clock_tags(tool: exiftool.ExifTool, path: Path) -> dict[str, Any]:
    """Every date/time tag exiftool finds in the file (``-time:all``, group family 1), and the facts a
    clock encodes (:data:`photos.clocks.ENCODING_CLOCKS`: Pentax's ShutterCount)."""
    encoded = [f"-{fact}" for fact, _ in ENCODING_CLOCKS]
    out = tool.execute("-j", "-G1", "-a", "-time:all", *encoded, os.path.abspath(path), retry_if_died=True)
    return _json_record(path, out)


def _json_record(path: Path, out: str) -> dict[str, Any]:
    try:
        # Keep numbers as their literal text: a keyword "2024" or "1.50" must stay a string.
        records = json.loads(out, parse_int=str, parse_float=str) if out.strip() else [{}]
        record: dict[str, Any] = dict(records[0])
    except (ValueError, IndexError, TypeError, AttributeError) as exc:
        # never quote it: the output carries the file's metadata
        raise PhotoError(path, f"unexpected exiftool output ({len(out)} characters, not JSON)") from exc
    record.pop("SourceFile", None)
    return record


def exiftool_args(
    edit: ExifEdit,
    *,
    fmt: str = "JPEG",
    current: Mapping[str, Any] | None = None,
    path: Path | None = None,
    clocks: Mapping[str, Any] | None = None,
    iptc_charset: str | None = None,
    renew_digest: bool = False,
    unshifted: list[str] | None = None,
) -> list[str]:
    """The exiftool arguments (for use with ``-ec``) that apply ``edit`` to a ``fmt`` file whose
    tags (from ``-j -G1 -a``, see ``_current_tags``) are ``current`` and whose date/time tags
    (``_clock_tags``) are ``clocks``; ``iptc_charset`` is the real charset of an IPTC block that
    does not declare UTF-8 (:func:`photos.iptc.source_charset`), converted as it is written;
    ``renew_digest``: the file's ``IPTCDigest`` is stale (exiftool warned "not current"), renew it.

    Written only where the file already speaks: EXIF only into a file that has an EXIF block, IPTC
    only in the formats that carry it, XMP always; ``IPTCDigest`` is renewed where it exists."""
    current = current or {}
    where = path or Path("<file>")
    args: list[str] = []
    iptc = speaks_iptc(fmt, current)
    has_exif = any(in_group(key.split(":", 1)[0], "EXIF") for key in current)
    xmp_written = False

    def assign(tag: str, values: str | list[str] | None) -> None:
        nonlocal xmp_written
        group, name = tag.split(":", 1)
        if (group == "IPTC" and not iptc) or (group == "EXIF" and not has_exif):
            return
        xmp_written = xmp_written or group.startswith("XMP")
        items = [values] if isinstance(values, str) else list(values or [])
        items = [v for v in items if v]
        if group == "IPTC":
            items = [iptc_cut(name, v) for v in items]
        if not items:
            args.append(f"-{tag}=")
        args.extend(f"-{tag}={_exiftool_value(v)}" for v in items)

    if edit.keywords is not None or edit.keywords_remove is not None:
        writes = keyword_writes(
            edit.keywords, edit.keywords_remove, edit.keywords_mode, current, iptc=iptc, has_exif=has_exif
        )
        for tag, values in writes:
            assign(tag, values)
    if edit.description is not None:
        assign("XMP-dc:Description", edit.description)
        assign("IPTC:Caption-Abstract", edit.description)
        assign("EXIF:ImageDescription", edit.description)
    if edit.rating is not None:
        args.append(f"-XMP-xmp:Rating={edit.rating}")
        if existing(current, "EXIF", "Rating") or existing(current, "EXIF", "RatingPercent"):
            # Microsoft's EXIF rating only where the file has one (exiftool -validate: non-standard tag)
            args += [f"-EXIF:Rating={edit.rating}", f"-EXIF:RatingPercent={_RATING_PERCENT[edit.rating]}"]
        xmp_written = True
    if edit.artist is not None:
        assign("XMP-dc:Creator", edit.artist)
        assign("IPTC:By-line", edit.artist)
        assign("EXIF:Artist", edit.artist)
    if edit.copyright is not None:
        assign("XMP-dc:Rights", edit.copyright)
        assign("IPTC:CopyrightNotice", edit.copyright)
        assign("EXIF:Copyright", edit.copyright)
    if edit.shift:
        args += clock_args(edit.shift, clocks or {}, where, unshifted)
        xmp_written = xmp_written or any(a.startswith("-XMP") for a in args)
    iptc_args = [a for a in args if a.startswith("-IPTC:")]
    if iptc_args:
        named = sorted({a[1:].split("=", 1)[0] for a in iptc_args})  # set or cleared: never copied back
        if any(not a.endswith("=") for a in iptc_args):
            args += charset_args(current, named, iptc_charset)
    if (iptc_args or (renew_digest and args and iptc)) and current.get("Photoshop:IPTCDigest"):
        args.append("-Photoshop:IPTCDigest=new")  # Photoshop and Lightroom compare it with the block
    if any(a.startswith(("-EXIF:", "-IFD0:")) for a in args) and "IFD0:YCbCrPositioning" not in current:
        # exiftool adds this "mandatory" tag to an IFD0 it creates (a PNG's EXIF): never unasked
        args.append("-IFD0:YCbCrPositioning=")
    if xmp_written:
        # Keep the XMP toolkit stamp as it was (exiftool would put its own name there, or add one).
        toolkit = current.get("XMP-x:XMPToolkit")
        args.append(f"-XMP-x:XMPToolkit={_exiftool_value(str(toolkit))}" if toolkit else "-XMP-x:XMPToolkit=")
    return args


def speaks_iptc(fmt: str, current: Mapping[str, Any]) -> bool:
    """Whether the file's IPTC is written: JPEG and TIFF always, any other format (a PNG's IPTC
    profile) where it already has an IPTC block, so no store is left stale."""
    return fmt in IPTC_FORMATS or any(key.split(":", 1)[0] == "IPTC" for key in current)


def _xp_left_out(args: list[str]) -> list[str]:
    """The keywords left out of a rewritten ``XPKeywords`` (beyond UCS-2: emoji)."""
    if not any(a.startswith("-EXIF:XPKeywords=") for a in args):
        return []
    flat = [a.split("=", 1)[1] for a in args if a.startswith("-XMP-dc:Subject=")]
    return [k for k in flat if k and beyond_ucs2(k)]


def _exiftool_value(text: str) -> str:
    """Escape a value for exiftool's ``-ec`` (C-style) unescaping."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


# -- reading -------------------------------------------------------------------------------------
_READ_TAGS = (
    "-XMP-dc:Subject",
    "-IPTC:Keywords",
    "-EXIF:XPKeywords",
    "-XMP-dc:Description",
    "-IPTC:Caption-Abstract",
    "-EXIF:ImageDescription",
    "-XMP-xmp:Rating",
    "-EXIF:Rating",
    "-XMP-dc:Creator",
    "-IPTC:By-line",
    "-EXIF:Artist",
    "-XMP-dc:Rights",
    "-IPTC:CopyrightNotice",
    "-EXIF:Copyright",
    "-EXIF:DateTimeOriginal",
)


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What :func:`write_metadata` writes, as photo apps read it: ``keywords`` (list, see
    :func:`photos.keywords.file_keywords`), ``description``, ``rating``, ``artist``,
    ``copyright`` and ``taken`` (ISO, from DateTimeOriginal). XMP is preferred, then IPTC (in its
    real charset), then EXIF. Needs exiftool."""
    path = Path(path)
    data = read_source(path)
    fmt = format_of(path, data)
    del data
    if not exiftool.available():
        raise NeedsExiftool(path, f"reading {fmt} metadata needs exiftool ({_INSTALL})")
    tool = exiftool.ExifTool.shared()
    out = tool.execute("-j", "-struct", "-G1", "-n", *_READ_TAGS, os.path.abspath(path), retry_if_died=True)
    grouped = _json_record(path, out)
    if fmt in IPTC_FORMATS and source_charset(tool, path, grouped) == "UTF8":
        grouped.update({k: v for k, v in reread_as_utf8(tool, path).items() if k in grouped})

    def first(*names: str) -> Any:
        for name in names:
            group, tag = name.split(":", 1)
            for key, value in grouped.items():
                key_group, key_tag = key.split(":", 1)
                if key_tag == tag and (
                    key_group == group or (group == "EXIF" and in_group(key_group, "EXIF"))
                ):
                    if value not in (None, "", []):
                        return value
        return None

    result: dict[str, Any] = {
        "keywords": [],
        "description": None,
        "rating": None,
        "artist": None,
        "copyright": None,
        "taken": None,
    }
    result["keywords"] = file_keywords(grouped)  # XMP's list, else IPTC + XPKeywords less lossy copies
    result["description"] = _str_or_none(
        first("XMP-dc:Description", "IPTC:Caption-Abstract", "EXIF:ImageDescription")
    )
    creator = first("XMP-dc:Creator", "IPTC:By-line", "EXIF:Artist")
    result["artist"] = "; ".join(map(str, creator)) if isinstance(creator, list) else _str_or_none(creator)
    result["copyright"] = _str_or_none(first("XMP-dc:Rights", "IPTC:CopyrightNotice", "EXIF:Copyright"))
    rating = first("XMP-xmp:Rating", "EXIF:Rating")
    try:
        result["rating"] = int(float(str(rating))) if rating is not None else None
    except ValueError:
        result["rating"] = None
    result["taken"] = _iso(_str_or_none(first("EXIF:DateTimeOriginal")))
    return result


#: The former name (it used to be the cross-check of an in-process reader).
read_metadata_exiftool = read_metadata


def _iso(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return datetime.strptime(text.strip()[:19], _EXIF_DT_FORMAT).isoformat()
    except ValueError:
        return None


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):  # lang-alt with several languages
        value = value.get("x-default") or next(iter(value.values()), None)
    text = str(value)
    return text or None
