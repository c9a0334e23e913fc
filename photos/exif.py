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
always (no EXIF block, no IFD0 resolution, no time zone is ever invented):

==============  ============================================================================
keywords        added to the file's own (``keywords_remove`` takes out, ``keywords_mode=replace``
                replaces): XMP-dc:Subject, IPTC:Keywords, EXIF:XPKeywords; a hierarchical
                ``a|b|c`` also in XMP-lr:HierarchicalSubject (its leaf ``c`` in the flat lists)
description     XMP-dc:Description, IPTC:Caption-Abstract, EXIF:ImageDescription
rating          XMP-xmp:Rating; EXIF:Rating (+ EXIF:RatingPercent) where the file has one
artist          XMP-dc:Creator, IPTC:By-line, EXIF:Artist
copyright       XMP-dc:Rights, IPTC:CopyrightNotice, EXIF:Copyright
shift           every clock exiftool reads (``-time:all``): EXIF IFD0/ExifIFD/IFD1, XMP, IPTC
                DateCreated/TimeCreated and DigitalCreationDate/Time, PNG, QuickTime, maker
                notes (see :func:`clock_args`); not GPS (UTC), ICC or file system times
==============  ============================================================================

IPTC is written with ``CodedCharacterSet=UTF8`` (an existing IPTC block in another character set is
converted, so its other values keep their text) and its ``IPTCDigest`` renewed where the file has
one. IPTC length limits (keyword 64 bytes, by-line 32, copyright 128, caption 2000) are honoured by
cutting the IPTC copy at a character boundary; XMP and EXIF get the whole value. An XMP toolkit
stamp is never added or changed. WebP is refused (Debian's exiftool 12.57 cannot write RIFF files).

Errors: missing/empty/non-image input, or an image Pillow cannot decode -> UnreadableImage;
exiftool missing -> NeedsExiftool naming the install command; an exiftool error or warning about
the file (reading or writing) -> PhotoError naming the file (the staged output is removed).
:func:`read_metadata` reads the fields back through exiftool.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from photos import exiftool
from photos.errors import InvalidParameter, NeedsExiftool, PhotoError, UnreadableImage, describe_content

_SHIFT_RE = re.compile(r"^([+-]?)(?=\d)(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_MAX_SHIFT = timedelta(days=365 * 200)
_EXIF_DT_FORMAT = "%Y:%m:%d %H:%M:%S"
_RATING_PERCENT = {0: 0, 1: 1, 2: 25, 3: 50, 4: 75, 5: 99}
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}
_EDITABLE = (
    "keywords", "keywords_remove", "keywords_mode", "description", "rating", "artist", "copyright", "shift"
)
KEYWORD_MODES = ("add", "replace")
#: Separator of a hierarchical keyword (``Places|Ireland|Dublin``), as Lightroom and digiKam write it.
HIERARCHY = "|"
#: Formats that carry a standard IPTC block.
IPTC_FORMATS = frozenset({"JPEG", "TIFF"})
#: IPTC IIM maximum lengths in bytes.
_IPTC_LIMITS = {"Keywords": 64, "Caption-Abstract": 2000, "By-line": 32, "CopyrightNotice": 128}
_INSTALL = "apt-get install libimage-exiftool-perl"


@dataclass
class ExifEdit:
    """What to change. ``None`` leaves a field as it is; ``""`` clears a text field.

    ``keywords`` are added to the file's keywords (its order kept, no duplicates, compared
    case-sensitively) and ``keywords_remove`` taken out; with ``keywords_mode="replace"`` the file's
    keywords become exactly ``keywords`` (``[]`` clears them). A keyword may be hierarchical
    (``Places|Ireland|Dublin``). No ``;`` or control characters in a keyword. ``rating`` is 0-5;
    ``shift`` moves every clock the photo carries (see :func:`clock_args`).
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
            self.keywords = _clean_keywords("keywords", self.keywords)
        if self.keywords_remove is not None:
            self.keywords_remove = _clean_keywords("keywords_remove", self.keywords_remove)
        if self.keywords_mode not in KEYWORD_MODES:
            raise InvalidParameter(
                f"keywords_mode must be one of {', '.join(KEYWORD_MODES)}, got {self.keywords_mode!r}"
            )
        if self.keywords_mode == "replace" and self.keywords_remove:
            raise InvalidParameter("keywords_remove has no meaning with keywords_mode=replace")
        for name in ("description", "artist", "copyright"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or _has_control(value, allow_newline=True)):
                raise InvalidParameter(f"{name} must be text without control characters, got {value!r}")
        if self.rating is not None and (
            isinstance(self.rating, bool) or not isinstance(self.rating, int) or not 0 <= self.rating <= 5
        ):
            raise InvalidParameter(f"rating must be an integer 0-5, got {self.rating!r}")
        if isinstance(self.shift, str):
            self.shift = parse_shift(self.shift)
        if self.shift is not None and (
            not isinstance(self.shift, timedelta) or abs(self.shift) > _MAX_SHIFT or self.shift.microseconds
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


def _clean_keywords(name: str, keywords: Any) -> list[str]:
    """Stripped, non-empty, unique keywords in their order; a hierarchical one as ``a|b|c``."""
    if isinstance(keywords, str) or not isinstance(keywords, (list, tuple)):
        raise InvalidParameter(f"{name} must be a list of strings, got {keywords!r}")
    cleaned: list[str] = []
    for raw in keywords:
        if not isinstance(raw, str):
            raise InvalidParameter(f"{name} must be a list of strings, got {keywords!r}")
        kw = raw.strip()
        if not kw:
            continue
        if ";" in kw or _has_control(kw, allow_newline=False):
            raise InvalidParameter(f"keyword {kw!r} may not contain ';' or control characters")
        if HIERARCHY in kw:
            parts = [part.strip() for part in kw.split(HIERARCHY)]
            if not all(parts):
                raise InvalidParameter(
                    f"hierarchical keyword {kw!r} has an empty level "
                    "(write the levels as 'Places|Ireland|Dublin')"
                )
            kw = HIERARCHY.join(parts)
        if kw not in cleaned:
            cleaned.append(kw)
    return cleaned


def _has_control(text: str, *, allow_newline: bool) -> bool:
    allowed = {"\n", "\r", "\t"} if allow_newline else set()
    return any((ord(c) < 32 or ord(c) == 127) and c not in allowed for c in text)


def parse_shift(text: str) -> timedelta:
    """``"+1h"``, ``"-30m"``, ``"+1d2h"``, ``"+90s"`` (units d, h, m, s in that order) → timedelta."""
    m = _SHIFT_RE.match(text.strip()) if isinstance(text, str) else None
    if not m or not any(m.group(i) for i in range(2, 6)):
        raise InvalidParameter(
            f"invalid time shift {text!r}: use a sign and d/h/m/s units in that order, "
            "e.g. '+1h', '-30m', '+1d2h', '+90s'"
        )
    days, hours, minutes, seconds = (int(m.group(i) or 0) for i in range(2, 6))
    try:
        delta = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    except OverflowError as exc:
        raise InvalidParameter(f"time shift {text!r} is too large") from exc
    if delta > _MAX_SHIFT:
        raise InvalidParameter(f"time shift {text!r} is larger than 200 years")
    return -delta if m.group(1) == "-" else delta


# -- format detection ----------------------------------------------------------------------------
def sniff_format(head: bytes) -> str | None:
    """``"JPEG"``, ``"PNG"``, ``"TIFF"``, ``"HEIF"`` from a file's first 16 bytes, else None."""
    if head[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if head[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[4:8] == b"ftyp" and head[8:12] in _HEIF_BRANDS:
        return "HEIF"
    return None


def _read_source(src: Path) -> bytes:
    try:
        data = src.read_bytes()
    except FileNotFoundError as exc:
        raise UnreadableImage(src, "file does not exist") from exc
    except PermissionError as exc:
        raise UnreadableImage(src, "permission denied (file is not readable)") from exc
    except IsADirectoryError as exc:
        raise UnreadableImage(src, "is a directory, not an image file") from exc
    except OSError as exc:
        raise UnreadableImage(src, f"cannot read file: {exc.strerror or exc}") from exc
    if not data:
        raise UnreadableImage(src, "file is empty (0 bytes)")
    return data


def _format_of(src: Path, data: bytes) -> str:
    fmt = sniff_format(data[:16])
    if fmt is None and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise PhotoError(
            src,
            "WebP metadata is not written: the exiftool this system has (Debian 12's 12.57) cannot "
            "write RIFF/WebP files ('Can't write RIFF files'); the file is left untouched",
        )
    if fmt is None:
        looks = describe_content(data[:512], len(data))  # never quote the file's bytes
        raise UnreadableImage(src, f"not a JPEG, PNG, TIFF or HEIC/HEIF file ({looks})")
    return fmt


# -- JPEG structure ------------------------------------------------------------------------------
@dataclass
class _Jpeg:
    segments: list[tuple[int, int, int]]  # (marker, start, end) of each header segment before SOS
    scan_start: int  # offset of the SOS marker: everything from here on is copied unchanged


def _split_jpeg(src: Path, data: bytes) -> _Jpeg:
    """Find the marker segments before the first SOS; raise UnreadableImage on a broken header."""
    if data[:2] != b"\xff\xd8":
        raise UnreadableImage(src, "not a JPEG file (no SOI marker)")
    pos, n = 2, len(data)
    segments: list[tuple[int, int, int]] = []
    while True:
        if pos >= n or data[pos] != 0xFF:
            raise UnreadableImage(src, f"corrupt JPEG header: expected a marker at byte {pos}")
        while pos < n and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= n:
            raise UnreadableImage(src, "truncated JPEG header (no image data)")
        marker, start = data[pos], pos - 1
        pos += 1
        if marker == 0xD9:
            raise UnreadableImage(src, "JPEG ends before any image data (EOI before SOS)")
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:
            continue  # standalone markers carry no length
        if pos + 2 > n:
            raise UnreadableImage(src, "truncated JPEG header")
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if length < 2 or pos + length > n:
            raise UnreadableImage(src, f"truncated JPEG header (segment 0xFF{marker:02X} at byte {start})")
        if marker == 0xDA:
            return _Jpeg(segments, start)
        segments.append((marker, start, pos + length))
        pos += length


def jpeg_scan_data(data: bytes, path: str | os.PathLike[str] = "<bytes>") -> bytes:
    """The bytes of a JPEG from its first SOS marker to the end (the compressed image)."""
    return data[_split_jpeg(Path(path), data).scan_start :]


# -- writing -------------------------------------------------------------------------------------
def write_metadata(src: str | os.PathLike[str], dst: str | os.PathLike[str], edit: ExifEdit) -> None:
    """Write a copy of ``src`` with ``edit`` applied to ``dst`` (replaced if it exists), fsynced,
    with the modification time of ``src``.

    Only the asked tags change (see the module docstring). Raises UnreadableImage for missing,
    empty or non-image input, NeedsExiftool when exiftool is missing, PhotoError when exiftool
    reports an error or a warning for the file or a date cannot be shifted; ``dst`` is then absent.
    """
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise PhotoError(src, "write_metadata needs a separate destination; the source is never modified")
    data = _read_source(src)
    fmt = _format_of(src, data)
    _check_complete(src, fmt, data)  # exiftool edits metadata without reading the image data
    del data
    check_decodes(src)
    if not exiftool.available():
        raise NeedsExiftool(src, f"writing {fmt} metadata needs exiftool ({_INSTALL})")
    dst.parent.mkdir(parents=True, exist_ok=True)
    _unlink_quietly(dst)  # exiftool -o refuses an existing output; dst is the caller's staged path
    tool = exiftool.ExifTool.shared()
    src_abs = os.path.abspath(src)
    current = _current_tags(tool, src) if not edit.is_empty() else {}
    clocks = _clock_tags(tool, src) if edit.shift else {}
    args = exiftool_args(edit, fmt=fmt, current=current, path=src, clocks=clocks)
    if not args:
        shutil.copy2(src, dst)  # nothing to change: an identical copy, same modification time
    else:
        warnings = _exiftool_write(tool, src, src_abs, dst, args)
        if warnings:
            _unlink_quietly(dst)
            said = "; ".join(w.removesuffix(f" - {src_abs}") for w in warnings)
            raise PhotoError(src, f"exiftool warned, nothing written: {said}")
        # -P keeps whole seconds only: give the copy the exact times (and the permissions) of the source
        times = src.stat()
        os.chmod(dst, stat.S_IMODE(times.st_mode))
        os.utime(dst, ns=(times.st_atime_ns, times.st_mtime_ns))
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())


_OUT_NAMES = itertools.count()


def _exiftool_write(
    tool: exiftool.ExifTool, src: Path, src_abs: str, dst: Path, args: list[str]
) -> list[str]:
    """Run exiftool's ``-o`` write of ``src_abs`` to ``dst``; return its warnings (``dst`` is then
    present, to be removed by the caller) or raise PhotoError (``dst`` absent).

    exiftool expands ``%d``, ``%f``, ``%e``, ``%c`` (and ``%:9d``-style forms) in its ``-o``
    argument, and ``%%`` does not escape them in 12.57, so ``dst``'s own path -- whose folders and
    name a rename pattern or a photo's name chose -- is never handed to it: exiftool writes into
    ``dst``'s folder through ``/proc/PID/fd/N`` of a descriptor held here (a path of digits only),
    under a name chosen here (the staged-file pattern, so the sweeper removes it if the worker
    dies before the rename), and the result is renamed to ``dst`` within that same folder."""
    folder = os.open(dst.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    name = f".exiftool.pj-x{os.getpid()}-{next(_OUT_NAMES)}.tmp"
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
            os.replace(name, dst.name, src_dir_fd=folder, dst_dir_fd=folder)
        except FileNotFoundError:
            raise PhotoError(src, "exiftool reported success but wrote no output file") from None
        return warnings
    finally:
        os.close(folder)


def _unlink_at(folder: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass


def _check_complete(src: Path, fmt: str, data: bytes) -> None:
    """Refuse a JPEG whose header is broken or whose image data was cut off (no EOI marker after
    the scan: inside entropy-coded data 0xFF is always stuffed, so FF D9 only ends the image), or
    a PNG without its IEND chunk. exiftool itself would edit their metadata without noticing."""
    if fmt == "JPEG":
        scan = _split_jpeg(src, data).scan_start
        if data.find(b"\xff\xd9", scan) < 0:
            raise UnreadableImage(src, "truncated JPEG: the image data has no end (EOI) marker")
    elif fmt == "PNG" and data.rfind(b"IEND") < 0:
        raise UnreadableImage(src, "truncated PNG: no IEND chunk")


def check_decodes(src: str | os.PathLike[str], *, max_pixels: int = 200_000_000) -> None:
    """Refuse (UnreadableImage) a file Pillow cannot decode: its structure is verified and every
    pixel row read (a JPEG at its smallest DCT scale, which still decodes all of its scan data).
    Every writing lane calls this, whether or not the job analyses its photos."""
    from PIL import Image

    import photos.analyze  # noqa: F401  (registers the HEIF opener)

    path = Path(src)
    try:
        with Image.open(path) as img:
            if img.width * img.height > max_pixels:
                size = f"{img.width}x{img.height}"
                raise UnreadableImage(path, f"image of {size} pixels is larger than {max_pixels}")
            img.verify()
        with Image.open(path) as img:
            if img.format == "JPEG":
                img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
            img.load()
    except UnreadableImage:
        raise
    except Image.DecompressionBombError as exc:
        raise UnreadableImage(path, f"decompression bomb: {exc}") from None
    except (OSError, SyntaxError, ValueError, EOFError, struct.error, IndexError, TypeError) as exc:
        what = type(exc).__name__
        raise UnreadableImage(path, f"the image does not decode ({what}); nothing was written") from None


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


_STATE_TAGS = (
    "-XMP-x:XMPToolkit",
    "-IPTC:all",
    "-XMP-dc:Subject",
    "-XMP-lr:HierarchicalSubject",
    "-Photoshop:IPTCDigest",
    "-EXIF:all",
)


def _current_tags(tool: exiftool.ExifTool, path: Path) -> dict[str, Any]:
    """The tags a write depends on: the XMP toolkit, the IPTC block, the keywords, the IPTC digest,
    and the EXIF block (whether the file has one at all)."""
    out, warnings = tool.execute_with_warnings(
        "-j", "-G1", "-a", *_STATE_TAGS, os.path.abspath(path), retry_if_died=True
    )
    serious = [w for w in warnings if "[minor]" not in w.lower()]
    if serious:  # e.g. "Bad IFD0 directory": what the file says cannot be read, so nothing is written
        said = "; ".join(w.removesuffix(f" - {os.path.abspath(path)}") for w in serious)
        raise PhotoError(path, f"exiftool warned, nothing written: {said}")
    return _json_record(path, out)


def _clock_tags(tool: exiftool.ExifTool, path: Path) -> dict[str, Any]:
    """Every date/time tag exiftool finds in the file (``-time:all``, group family 1)."""
    out = tool.execute("-j", "-G1", "-a", "-time:all", os.path.abspath(path), retry_if_died=True)
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


def _iptc_cut(tag: str, value: str) -> str:
    """``value`` cut to the IPTC byte limit of ``tag`` at a character boundary."""
    limit = _IPTC_LIMITS[tag]
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    return raw[:limit].decode("utf-8", "ignore")


def _has_time(value: Any) -> bool:
    """False for blank or all-zero dates ("0000:00:00 00:00:00" means unknown): left unshifted."""
    text = str(value).strip()
    return bool(text) and not set(text) <= set("0: ")


def _check_date(path: Path, key: str, value: Any, shift: timedelta) -> None:
    """Refuse a date exiftool could not shift (it would skip it with a warning)."""
    text = str(value).strip()
    moved = None
    for width, form in ((19, _EXIF_DT_FORMAT), (16, "%Y:%m:%d %H:%M"), (10, "%Y:%m:%d")):
        if len(text) == width or (len(text) > width and not text[width].isdigit()):
            try:
                moved = datetime.strptime(text[:width], form) + shift
                break
            except (ValueError, OverflowError):
                continue
    if moved is None:
        raise PhotoError(
            path, f"cannot shift {key}: its {len(text)} characters are not a date/time (YYYY:MM:DD HH:MM:SS)"
        )
    if not 1 <= moved.year <= 9999:
        raise PhotoError(path, f"cannot shift {key}: shifted by {shift} it leaves the years 1-9999")


def exiftool_args(
    edit: ExifEdit,
    *,
    fmt: str = "JPEG",
    current: Mapping[str, Any] | None = None,
    path: Path | None = None,
    clocks: Mapping[str, Any] | None = None,
) -> list[str]:
    """The exiftool arguments (for use with ``-ec``) that apply ``edit`` to a ``fmt`` file whose
    tags (from ``-j -G1 -a``, see ``_current_tags``) are ``current`` and whose date/time tags
    (``_clock_tags``) are ``clocks``.

    Written only where the file already speaks: EXIF only into a file that has an EXIF block, IPTC
    only in the formats that carry it, XMP always; ``IPTCDigest`` is renewed where it exists."""
    current = current or {}
    where = path or Path("<file>")
    args: list[str] = []
    iptc = fmt in IPTC_FORMATS
    has_exif = any(_in_group(key.split(":", 1)[0], "EXIF") for key in current)
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
            items = [_iptc_cut(name, v) for v in items]
        if not items:
            args.append(f"-{tag}=")
        args.extend(f"-{tag}={_exiftool_value(v)}" for v in items)

    if edit.keywords is not None or edit.keywords_remove is not None:
        for tag, values in _keyword_writes(edit, current, iptc=iptc, has_exif=has_exif):
            assign(tag, values)
    if edit.description is not None:
        assign("XMP-dc:Description", edit.description)
        assign("IPTC:Caption-Abstract", edit.description)
        assign("EXIF:ImageDescription", edit.description)
    if edit.rating is not None:
        args.append(f"-XMP-xmp:Rating={edit.rating}")
        if _existing(current, "EXIF", "Rating") or _existing(current, "EXIF", "RatingPercent"):
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
        args += clock_args(edit.shift, clocks or {}, where)
        xmp_written = xmp_written or any(a.startswith("-XMP") for a in args)
    iptc_args = [a for a in args if a.startswith("-IPTC:")]
    if iptc_args:
        assigned = sorted({a[1:].split("=", 1)[0] for a in iptc_args if not a.endswith("=")})
        if assigned:
            args += _iptc_charset_args(current, assigned)
        if current.get("Photoshop:IPTCDigest"):
            args.append("-Photoshop:IPTCDigest=new")  # Photoshop and Lightroom compare it with the block
    if xmp_written:
        # Keep the XMP toolkit stamp as it was (exiftool would put its own name there, or add one).
        toolkit = current.get("XMP-x:XMPToolkit")
        args.append(f"-XMP-x:XMPToolkit={_exiftool_value(str(toolkit))}" if toolkit else "-XMP-x:XMPToolkit=")
    return args


def _listed(value: Any) -> list[str]:
    if value in (None, ""):
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _unique(values: list[str]) -> list[str]:
    out: list[str] = []
    for value in values:
        if value and value not in out:
            out.append(value)
    return out


def _leaf(keyword: str) -> str:
    return keyword.rsplit(HIERARCHY, 1)[-1]


def _existing(current: Mapping[str, Any], group: str, name: str) -> list[str]:
    return [
        v
        for key, value in current.items()
        if key.split(":", 1)[-1] == name and _in_group(key.split(":", 1)[0], group)
        for v in _listed(value)
    ]


def _keyword_writes(
    edit: ExifEdit, current: Mapping[str, Any], *, iptc: bool, has_exif: bool
) -> list[tuple[str, list[str] | str]]:
    """Where the new keyword lists go, only the places whose list changes: flat keywords (the leaf
    of a hierarchical one) in XMP-dc:Subject, IPTC:Keywords and EXIF:XPKeywords, the full paths of
    hierarchical ones in XMP-lr:HierarchicalSubject (as Lightroom and digiKam write them)."""
    xmp = _existing(current, "XMP-dc", "Subject")
    iptc_kw = _existing(current, "IPTC", "Keywords")
    xp = [k.strip() for v in _existing(current, "EXIF", "XPKeywords") for k in v.split(";") if k.strip()]
    hier_now = _existing(current, "XMP-lr", "HierarchicalSubject")
    if edit.keywords_mode == "replace":
        flat: list[str] = []
        hier: list[str] = []
    else:
        flat = _unique([*xmp, *iptc_kw, *xp])
        hier = _unique(list(hier_now))
    for kw in edit.keywords or []:
        if HIERARCHY in kw:
            hier = _unique([*hier, kw])
        flat = _unique([*flat, _leaf(kw)])
    for kw in edit.keywords_remove or []:
        if HIERARCHY in kw:
            hier = [h for h in hier if h != kw]
            leaf = _leaf(kw)
            if not any(_leaf(h) == leaf for h in hier):
                flat = [k for k in flat if k != leaf]
        else:
            flat = [k for k in flat if k != kw]
            hier = [h for h in hier if _leaf(h) != kw]
    writes: list[tuple[str, list[str] | str]] = []
    if flat != xmp:
        writes.append(("XMP-dc:Subject", flat))
    if hier != hier_now:
        writes.append(("XMP-lr:HierarchicalSubject", hier))
    if iptc and flat != iptc_kw:
        writes.append(("IPTC:Keywords", flat))
    if has_exif and flat != xp:
        writes.append(("EXIF:XPKeywords", ";".join(flat)))
    return writes


#: Clock groups a shift leaves alone: file system times, computed tags, GPS time (UTC from the
#: satellites, not the camera's clock), the ICC profile's creation date (not the photo's) and the
#: XMP media-management history (a log of past saves, kept in structures exiftool cannot shift).
_UNSHIFTED_GROUPS = (
    "System", "File", "Composite", "ExifTool", "GPS", "ICC-header", "ICC_Profile", "XMP-xmpMM"
)
#: IPTC dates that are not the photo's clocks (transmission, release, expiry of the record).
_UNSHIFTED_TAGS = frozenset(
    {"DateSent", "TimeSent", "ReleaseDate", "ReleaseTime", "ExpirationDate", "ExpirationTime", "GPSDateTime",
     "GPSDateStamp", "GPSTimeStamp"}
)
_DATE_ONLY = re.compile(r"^\d{4}:\d{2}:\d{2}$")
_YEAR_OR_MONTH = re.compile(r"^\d{4}(:\d{2})?$")  # XMP dates of reduced precision
_DATE_TIME = re.compile(r"^\d{4}[:-]\d{2}[:-]\d{2}[ T]\d{2}:\d{2}")
#: The capture/digitized/modify dates: one of these holding something that is not a date/time
#: refuses the file (it cannot be shifted). Other time tags whose value is no date/time (offsets
#: such as OffsetTime "+02:00", SubSecTime "123", a maker note's world-time city) are no clocks.
_CLOCK_NAMES = frozenset(
    {"DateTimeOriginal", "CreateDate", "ModifyDate", "DateTimeDigitized", "DateCreated", "DateTime"}
)
_TIME_ONLY = re.compile(r"^(\d{2}:\d{2}:\d{2})(\.\d+)?([+-]\d{2}:?\d{2}|Z)?$")


def clock_args(shift: timedelta, clocks: Mapping[str, Any], path: Path) -> list[str]:
    """exiftool arguments moving every clock of the file by ``shift``.

    ``clocks`` is ``-time:all`` read with ``-j -G1 -a``: EXIF (IFD0, ExifIFD, IFD1 …), XMP, IPTC,
    PNG, QuickTime and maker-note dates alike. A full date/time is shifted by exiftool (``+=``,
    its zone kept); a date and a time kept apart (IPTC DateCreated/TimeCreated,
    DigitalCreationDate/Time, Pentax Date/Time) are shifted together so the day rolls over, and
    written back with exactly the zone they had (none if none). A lone date moves only by whole
    days; a lone time, or a year (and month) alone, stays. All-zero dates ("unknown") stay; a date
    that cannot be shifted raises PhotoError. File system times, GPS (UTC), ICC profile dates and
    the XMP editing history (``xmpMM``: a log of past saves) are left alone."""
    sign, amount = _exiftool_shift(shift)
    args: list[str] = []
    tags: dict[str, Any] = {}
    for key, value in clocks.items():
        if ":" not in key:
            continue
        group, name = key.split(":", 1)
        if group in _UNSHIFTED_GROUPS or name in _UNSHIFTED_TAGS or group.startswith("ICC"):
            continue
        tags[key] = value
    paired: set[str] = set()
    for key, value in tags.items():
        group, name = key.split(":", 1)
        text = str(value).strip()
        if "Date" not in name or not _DATE_ONLY.match(text) or not _has_time(text):
            continue
        partner = f"{group}:{name.replace('Date', 'Time')}"
        time_text = str(tags.get(partner, "")).strip()
        match = _TIME_ONLY.match(time_text)
        if partner != key and match:
            moved = _shift_parts(path, key, text, match.group(1), shift)
            args += [f"-{key}={moved[0]}", f"-{partner}={moved[1]}{match.group(3) or ''}"]
            paired |= {key, partner}
        elif not shift % timedelta(days=1):
            moved = _shift_parts(path, key, text, "00:00:00", shift)
            args.append(f"-{key}={moved[0]}")
            paired.add(key)
    for key, value in tags.items():
        if key in paired:
            continue
        if isinstance(value, list) or not _has_time(value) or _partial(value):
            continue  # a list (the XMP editing history), a lone date/time: nothing to roll over
        if not _DATE_TIME.match(str(value).strip()) and name_of(key) not in _CLOCK_NAMES:
            continue  # a time zone offset, sub-seconds, a city: not a clock
        _check_date(path, key, value, shift)
        args.append(f"-{key}{sign}={amount}")
    return args


def name_of(key: str) -> str:
    """``"ExifIFD:DateTimeOriginal"`` -> ``"DateTimeOriginal"``."""
    return key.split(":", 1)[-1]


def _partial(value: Any) -> bool:
    """A date without a time, a time without a date, or only a year (and month)."""
    text = str(value).strip()
    return bool(_DATE_ONLY.match(text) or _TIME_ONLY.match(text) or _YEAR_OR_MONTH.match(text))


def _shift_parts(path: Path, key: str, date: str, time: str, shift: timedelta) -> tuple[str, str]:
    """A date and a time kept in two tags, shifted together so the date rolls over correctly."""
    try:
        moved = datetime.strptime(f"{date[:10]} {time[:8]}", _EXIF_DT_FORMAT) + shift
    except (ValueError, OverflowError) as exc:
        raise PhotoError(path, f"cannot shift {key}: its date and time are not a valid date/time") from exc
    if not 1 <= moved.year <= 9999:
        raise PhotoError(path, f"cannot shift {key}: shifted by {shift} it leaves the years 1-9999")
    return moved.strftime("%Y:%m:%d"), moved.strftime("%H:%M:%S")


_EXIF_GROUPS = ("IFD0", "IFD1", "ExifIFD", "SubIFD", "GPS", "InteropIFD")


def _in_group(family1: str, group: str) -> bool:
    if group == "EXIF":
        return family1 in _EXIF_GROUPS or family1.startswith(("IFD", "SubIFD"))
    return family1 == group


def _iptc_charset_args(current: Mapping[str, Any], assigned: list[str]) -> list[str]:
    """Mark IPTC as UTF-8. An existing block in another character set is converted: its other
    values are copied back (read in their old charset, written as UTF-8) so their text is kept."""
    existing = [key for key in current if key.startswith("IPTC:")]
    charset = str(current.get("IPTC:CodedCharacterSet", ""))
    args = ["-IPTC:CodedCharacterSet=UTF8"]
    if existing and charset != "UTF8":
        exclude = sorted({f"--{tag}" for tag in assigned} | {"--IPTC:CodedCharacterSet"})
        args = ["-tagsFromFile", "@", "-IPTC:all", *exclude, *args]
    return args


def _exiftool_value(text: str) -> str:
    """Escape a value for exiftool's ``-ec`` (C-style) unescaping."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _exiftool_shift(delta: timedelta) -> tuple[str, str]:
    """("+" or "-", "0:0:D H:M:S") for exiftool's date shift syntax."""
    sign = "-" if delta < timedelta(0) else "+"
    total = int(abs(delta).total_seconds())
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return sign, f"0:0:{days} {hours}:{minutes}:{seconds}"


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
    """What :func:`write_metadata` writes, as photo apps read it: ``keywords`` (list),
    ``description``, ``rating``, ``artist``, ``copyright`` and ``taken`` (ISO, from
    DateTimeOriginal). XMP is preferred, then IPTC, then EXIF. Needs exiftool."""
    path = Path(path)
    data = _read_source(path)
    fmt = _format_of(path, data)
    del data
    if not exiftool.available():
        raise NeedsExiftool(path, f"reading {fmt} metadata needs exiftool ({_INSTALL})")
    out = exiftool.ExifTool.shared().execute(
        "-j", "-struct", "-G1", "-n", *_READ_TAGS, os.path.abspath(path), retry_if_died=True
    )
    grouped = _json_record(path, out)

    def first(*names: str) -> Any:
        for name in names:
            group, tag = name.split(":", 1)
            for key, value in grouped.items():
                key_group, key_tag = key.split(":", 1)
                if key_tag == tag and (
                    key_group == group or (group == "EXIF" and _in_group(key_group, "EXIF"))
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
    subject = first("XMP-dc:Subject", "IPTC:Keywords")
    if subject is not None:
        result["keywords"] = [str(k) for k in (subject if isinstance(subject, list) else [subject])]
    else:
        xp = first("EXIF:XPKeywords")
        if xp is not None:
            result["keywords"] = [k.strip() for k in str(xp).split(";") if k.strip()]
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
