"""Lossless metadata writing: keywords, description, rating, artist, copyright, time shift.

:func:`write_metadata` writes an edited copy of ``src`` to ``dst`` (a staged temp path chosen
by the caller); ``src`` is never modified and pixels are never re-encoded:

* JPEG is edited in-process with piexif: only the APP1 Exif segment is replaced, every other
  segment and everything from the SOS marker on is copied byte for byte. When the existing
  EXIF has a MakerNote (whose internal offsets piexif would break by moving it) or cannot be
  rewritten by piexif, exiftool does the edit instead (it fixes maker-note offsets), if present.
* PNG, TIFF and HEIC/HEIF go through exiftool (``-o dst src``); without exiftool they raise
  :class:`NeedsExiftool`.

Values written: EXIF ImageDescription, Artist, Copyright (UTF-8), XPKeywords (UTF-16LE, ``;``
separated), Rating and RatingPercent, DateTimeOriginal/DateTimeDigitized/DateTime shifted,
UserComment (JSON of ``facts``); through exiftool also XMP dc:subject, dc:description,
dc:creator, dc:rights and xmp:Rating. :func:`read_metadata` reads them back.
"""

from __future__ import annotations

import json
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import piexif

from photos import exiftool
from photos.errors import InvalidParameter, NeedsExiftool, PhotoError, UnreadableImage

#: When the JPEG's EXIF holds a MakerNote, let exiftool (which fixes maker-note offsets) do the edit.
MAKERNOTES_VIA_EXIFTOOL = True

_SHIFT_RE = re.compile(r"^([+-]?)(?=\d)(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_MAX_SHIFT = timedelta(days=365 * 200)
_EXIF_DT_FORMAT = "%Y:%m:%d %H:%M:%S"
_USER_COMMENT_ASCII = b"ASCII\x00\x00\x00"
_USER_COMMENT_UNICODE = b"UNICODE\x00"
_RATING_PERCENT = {0: 0, 1: 1, 2: 25, 3: 50, 4: 75, 5: 99}
_EXIF_HEADER = b"Exif\x00\x00"
_HEIF_BRANDS = {b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}
_EDITABLE = ("keywords", "description", "rating", "artist", "copyright", "shift", "facts")


@dataclass
class ExifEdit:
    """What to change. ``None`` leaves a field as it is; ``""`` / ``[]`` clears it.

    ``keywords`` replace the existing keywords (no ``;`` or newlines in a keyword); ``rating``
    is 0-5; ``shift`` moves the capture/digitized/modify times; ``facts`` (e.g. from analysis)
    are stored as JSON in EXIF UserComment.
    """

    keywords: list[str] | None = None
    description: str | None = None
    rating: int | None = None
    artist: str | None = None
    copyright: str | None = None
    shift: timedelta | None = None
    facts: dict[str, Any] | None = field(default=None)

    def __post_init__(self) -> None:
        if self.keywords is not None:
            if isinstance(self.keywords, str) or not all(isinstance(k, str) for k in self.keywords):
                raise InvalidParameter(f"keywords must be a list of strings, got {self.keywords!r}")
            cleaned: list[str] = []
            for kw in (k.strip() for k in self.keywords):
                if not kw:
                    continue
                if ";" in kw or _has_control(kw, allow_newline=False):
                    raise InvalidParameter(f"keyword {kw!r} may not contain ';' or control characters")
                if kw not in cleaned:
                    cleaned.append(kw)
            self.keywords = cleaned
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
        if self.facts is not None:
            try:
                json.dumps(self.facts, allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidParameter(f"facts must be JSON-serialisable: {exc}") from exc

    @classmethod
    def from_params(cls, params: Mapping[str, Any]) -> ExifEdit:
        """Build from job parameters (``shift`` may be a string such as ``"+1h"``)."""
        unknown = sorted(set(params) - set(_EDITABLE))
        if unknown:
            raise InvalidParameter(f"unknown metadata parameter(s) {unknown}; valid: {list(_EDITABLE)}")
        return cls(**dict(params))

    def is_empty(self) -> bool:
        """True when the edit changes nothing."""
        others = (getattr(self, f.name) for f in fields(self) if f.name != "shift")
        return not self.shift and all(value is None for value in others)


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
    if fmt is None:
        raise UnreadableImage(src, f"not a JPEG, PNG, TIFF or HEIC/HEIF file (starts with {data[:12]!r})")
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


def _exif_segment(data: bytes, jpeg: _Jpeg) -> tuple[int, int] | None:
    for marker, start, end in jpeg.segments:
        if marker == 0xE1 and data[start + 4 : start + 10] == _EXIF_HEADER:
            return start, end
    return None


# -- writing -------------------------------------------------------------------------------------
def write_metadata(src: str | os.PathLike[str], dst: str | os.PathLike[str], edit: ExifEdit) -> None:
    """Write a copy of ``src`` with ``edit`` applied to ``dst`` (replaced if it exists), fsynced.

    Pixels are never re-encoded (see the module docstring). Raises UnreadableImage for missing,
    empty or non-image input, NeedsExiftool when the format needs exiftool and it is missing,
    PhotoError when the edit cannot be applied (e.g. an invalid date to shift).
    """
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise PhotoError(src, "write_metadata needs a separate destination; the source is never modified")
    data = _read_source(src)
    fmt = _format_of(src, data)
    dst.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "JPEG":
        out = _edit_jpeg_in_process(src, data, edit)
        if out is not None:
            _write_file(dst, out)
            return
        if not exiftool.available():
            raise NeedsExiftool(
                src,
                "this JPEG's EXIF cannot be rewritten in-process; needs exiftool "
                "(apt-get install libimage-exiftool-perl)",
            )
    elif not exiftool.available():
        raise NeedsExiftool(src, f"{fmt} metadata needs exiftool (apt-get install libimage-exiftool-perl)")
    _write_with_exiftool(src, dst, edit)


def _write_file(dst: Path, data: bytes) -> None:
    """Write ``dst`` afresh (a stale file or symlink at that name is removed, never followed)."""
    _unlink_quietly(dst)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(dst, flags, 0o666), "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _edit_jpeg_in_process(src: Path, data: bytes, edit: ExifEdit) -> bytes | None:
    """The edited JPEG bytes, or None when exiftool should do the edit instead."""
    jpeg = _split_jpeg(src, data)
    found = _exif_segment(data, jpeg)
    try:
        exif_dict = piexif.load(data[found[0] + 4 : found[1]]) if found else _empty_exif()
    except Exception:  # piexif raises assorted errors on odd EXIF; exiftool copes
        return None
    if MAKERNOTES_VIA_EXIFTOOL and piexif.ExifIFD.MakerNote in exif_dict["Exif"] and exiftool.available():
        return None
    _apply_to_exif_dict(src, exif_dict, edit)
    try:
        payload = piexif.dump(exif_dict)
    except Exception:  # e.g. a tag stored with a type piexif does not expect
        return None
    if len(payload) + 2 > 0xFFFF:
        return None
    segment = b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload
    if found:
        header = data[: found[0]] + segment + data[found[1] : jpeg.scan_start]
    else:
        insert_at = 2
        for marker, _start, end in jpeg.segments:  # after leading APP0 (JFIF/JFXX) segments
            if marker != 0xE0:
                break
            insert_at = end
        header = data[:insert_at] + segment + data[insert_at : jpeg.scan_start]
    return header + data[jpeg.scan_start :]


def _empty_exif() -> dict[str, Any]:
    return {"0th": {}, "Exif": {}, "GPS": {}, "Interop": {}, "1st": {}, "thumbnail": None}


def _apply_to_exif_dict(src: Path, exif: dict[str, Any], edit: ExifEdit) -> None:
    zeroth, sub = exif["0th"], exif["Exif"]
    image_ifd, exif_ifd = piexif.ImageIFD, piexif.ExifIFD

    def put(ifd: dict[int, Any], tag: int, value: Any) -> None:
        if value in (None, b"", ()):
            ifd.pop(tag, None)
        else:
            ifd[tag] = value

    if edit.description is not None:
        put(zeroth, image_ifd.ImageDescription, edit.description.encode("utf-8"))
    if edit.artist is not None:
        put(zeroth, image_ifd.Artist, edit.artist.encode("utf-8"))
    if edit.copyright is not None:
        put(zeroth, image_ifd.Copyright, edit.copyright.encode("utf-8"))
    if edit.keywords is not None:
        put(zeroth, image_ifd.XPKeywords, _utf16_tuple(";".join(edit.keywords)) if edit.keywords else None)
    if edit.rating is not None:
        zeroth[image_ifd.Rating] = edit.rating
        zeroth[image_ifd.RatingPercent] = _RATING_PERCENT[edit.rating]
    if edit.facts is not None:
        comment = json.dumps(edit.facts, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        sub[exif_ifd.UserComment] = _USER_COMMENT_ASCII + comment.encode("ascii")
    if edit.shift:
        for ifd, tag, name in (
            (sub, exif_ifd.DateTimeOriginal, "DateTimeOriginal"),
            (sub, exif_ifd.DateTimeDigitized, "DateTimeDigitized"),
            (zeroth, image_ifd.DateTime, "DateTime"),
        ):
            if tag in ifd:
                ifd[tag] = _shift_exif_datetime(src, name, ifd[tag], edit.shift)


def _utf16_tuple(text: str) -> tuple[int, ...]:
    return tuple((text + "\x00").encode("utf-16-le"))


def _shift_exif_datetime(src: Path, name: str, value: Any, shift: timedelta) -> Any:
    raw = value.decode("ascii", "replace") if isinstance(value, bytes) else str(value)
    text = raw.replace("\x00", "").strip()
    if not text or set(text) <= set("0: "):  # blank or "0000:00:00 00:00:00" means unknown
        return value
    try:
        moved = datetime.strptime(text[:19], _EXIF_DT_FORMAT) + shift
    except (ValueError, OverflowError) as exc:
        raise PhotoError(src, f"cannot shift {name}: {text!r} is not a valid EXIF date/time") from exc
    if not 1 <= moved.year <= 9999:
        raise PhotoError(src, f"cannot shift {name}: {text!r} shifted by {shift} leaves years 1-9999")
    return (moved.strftime(_EXIF_DT_FORMAT) + text[19:]).encode("ascii")


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


def exiftool_args(edit: ExifEdit) -> list[str]:
    """The exiftool tag assignments (for use with ``-ec``) that apply ``edit``."""
    args: list[str] = []

    def assign(tag: str, value: str | None) -> None:
        args.append(f"-{tag}={_exiftool_value(value)}" if value else f"-{tag}=")

    if edit.description is not None:
        assign("EXIF:ImageDescription", edit.description)
        assign("XMP-dc:Description", edit.description)
    if edit.artist is not None:
        assign("EXIF:Artist", edit.artist)
        assign("XMP-dc:Creator", edit.artist)
    if edit.copyright is not None:
        assign("EXIF:Copyright", edit.copyright)
        assign("XMP-dc:Rights", edit.copyright)
    if edit.keywords is not None:
        assign("EXIF:XPKeywords", ";".join(edit.keywords))
        if edit.keywords:
            args.extend(f"-XMP-dc:Subject={_exiftool_value(k)}" for k in edit.keywords)
        else:
            args.append("-XMP-dc:Subject=")
    if edit.rating is not None:
        args += [f"-EXIF:Rating={edit.rating}", f"-EXIF:RatingPercent={_RATING_PERCENT[edit.rating]}"]
        args.append(f"-XMP-xmp:Rating={edit.rating}")
    if edit.facts is not None:
        comment = json.dumps(edit.facts, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
        assign("EXIF:UserComment", comment)
    if edit.shift:
        sign, amount = _exiftool_shift(edit.shift)
        for tag in (
            "EXIF:DateTimeOriginal",
            "EXIF:CreateDate",
            "EXIF:ModifyDate",
            "XMP-exif:DateTimeOriginal",
            "XMP-xmp:CreateDate",
            "XMP-xmp:ModifyDate",
        ):
            args.append(f"-{tag}{sign}={amount}")
    return args


def _write_with_exiftool(src: Path, dst: Path, edit: ExifEdit) -> None:
    _unlink_quietly(dst)  # exiftool -o refuses an existing output; dst is the caller's staged path
    src_abs, dst_abs = os.path.abspath(src), os.path.abspath(dst)
    try:
        exiftool.ExifTool.shared().execute("-ec", *exiftool_args(edit), "-o", dst_abs, src_abs)
    except PhotoError as exc:
        _unlink_quietly(dst)
        raise PhotoError(src, exc.reason) from exc
    if not dst.exists():
        raise PhotoError(src, "exiftool reported success but wrote no output file")
    with open(dst, "rb+") as fh:
        os.fsync(fh.fileno())


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        pass


# -- reading -------------------------------------------------------------------------------------
def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What :func:`write_metadata` writes: ``keywords`` (list), ``description``, ``rating``,
    ``artist``, ``copyright``, ``taken`` (ISO from DateTimeOriginal) and ``facts`` (dict).

    JPEG is read in-process; other formats through exiftool (NeedsExiftool without it).
    """
    path = Path(path)
    data = _read_source(path)
    fmt = _format_of(path, data)
    if fmt == "JPEG":
        return _read_jpeg(path, data)
    if not exiftool.available():
        raise NeedsExiftool(
            path, f"reading {fmt} metadata needs exiftool (apt-get install libimage-exiftool-perl)"
        )
    return read_metadata_exiftool(path)


def _blank_metadata() -> dict[str, Any]:
    return {
        "keywords": [],
        "description": None,
        "rating": None,
        "artist": None,
        "copyright": None,
        "taken": None,
        "facts": None,
    }


def _read_jpeg(path: Path, data: bytes) -> dict[str, Any]:
    result = _blank_metadata()
    jpeg = _split_jpeg(path, data)
    found = _exif_segment(data, jpeg)
    if not found:
        return result
    try:
        exif = piexif.load(data[found[0] + 4 : found[1]])
    except Exception as exc:
        raise PhotoError(path, f"EXIF cannot be parsed: {exc}") from exc
    zeroth, sub = exif["0th"], exif["Exif"]
    ifd = piexif.ImageIFD
    xp = zeroth.get(ifd.XPKeywords)
    if xp:
        text = bytes(xp).decode("utf-16-le", "replace").rstrip("\x00")
        result["keywords"] = [k.strip() for k in text.split(";") if k.strip()]
    result["description"] = _ascii_text(zeroth.get(ifd.ImageDescription))
    result["artist"] = _ascii_text(zeroth.get(ifd.Artist))
    result["copyright"] = _ascii_text(zeroth.get(ifd.Copyright))
    rating = zeroth.get(ifd.Rating)
    result["rating"] = rating if isinstance(rating, int) else None
    result["taken"] = _iso(_ascii_text(sub.get(piexif.ExifIFD.DateTimeOriginal)))
    result["facts"] = _facts(_user_comment(sub.get(piexif.ExifIFD.UserComment)))
    return result


def _ascii_text(value: Any) -> str | None:
    if not isinstance(value, bytes):
        return None
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        text = value.decode("latin-1")
    return text.rstrip("\x00") or None


def _user_comment(value: Any) -> str | None:
    if not isinstance(value, bytes) or len(value) < 8:
        return None
    prefix, body = value[:8], value[8:]
    if prefix == _USER_COMMENT_UNICODE:
        return body.decode("utf-16-be" if body[:2] != b"\xff\xfe" else "utf-16", "replace").rstrip("\x00")
    return body.decode("utf-8", "replace").rstrip("\x00 ")


def _facts(text: str | None) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _iso(text: str | None) -> str | None:
    if not text:
        return None
    try:
        return datetime.strptime(text.strip()[:19], _EXIF_DT_FORMAT).isoformat()
    except ValueError:
        return None


_READ_TAGS = (
    "-XMP-dc:Subject",
    "-EXIF:XPKeywords",
    "-EXIF:ImageDescription",
    "-XMP-dc:Description",
    "-EXIF:Rating",
    "-XMP-xmp:Rating",
    "-EXIF:Artist",
    "-XMP-dc:Creator",
    "-EXIF:Copyright",
    "-XMP-dc:Rights",
    "-EXIF:DateTimeOriginal",
    "-EXIF:UserComment",
)


def read_metadata_exiftool(path: str | os.PathLike[str]) -> dict[str, Any]:
    """:func:`read_metadata` through exiftool, for any format it reads (also JPEG, to cross-check)."""
    path = Path(path)
    out = exiftool.ExifTool.shared().execute("-j", "-struct", "-G1", "-n", *_READ_TAGS, os.path.abspath(path))
    try:
        # Keep numbers as their literal text: a keyword "2024" or "1.50" must stay a string.
        records = json.loads(out, parse_int=str, parse_float=str) if out.strip() else [{}]
        grouped: dict[str, Any] = dict(records[0])
    except (ValueError, IndexError, AttributeError) as exc:
        raise PhotoError(path, f"unexpected exiftool output: {out[:200]!r}") from exc

    def first(*names: str) -> Any:
        for name in names:
            for key, value in grouped.items():
                if key.split(":", 1)[-1] == name and key.startswith(("IFD0", "ExifIFD", "XMP")):
                    if value not in (None, "", []):
                        return value
        return None

    result = _blank_metadata()
    subject = first("Subject")
    if subject is not None:
        result["keywords"] = [str(k) for k in (subject if isinstance(subject, list) else [subject])]
    else:
        xp = first("XPKeywords")
        if xp is not None:
            result["keywords"] = [k.strip() for k in str(xp).split(";") if k.strip()]
    result["description"] = _str_or_none(first("ImageDescription", "Description"))
    creator = first("Artist", "Creator")
    result["artist"] = "; ".join(map(str, creator)) if isinstance(creator, list) else _str_or_none(creator)
    result["copyright"] = _str_or_none(first("Copyright", "Rights"))
    rating = first("Rating")
    try:
        result["rating"] = int(str(rating)) if rating is not None else None
    except ValueError:
        result["rating"] = None
    result["taken"] = _iso(_str_or_none(first("DateTimeOriginal")))
    result["facts"] = _facts(_str_or_none(first("UserComment")))
    return result


def _str_or_none(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, dict):  # lang-alt with several languages
        value = value.get("x-default") or next(iter(value.values()), None)
    text = str(value)
    return text or None
