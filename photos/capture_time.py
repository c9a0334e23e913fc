"""When a photo was taken: its capture time from every source a camera, phone or photo app writes,
in one documented priority, with the source that was used (``taken_from``) and its sub-seconds.

Priority (the first source that holds a date *and* a time of day wins):

1. EXIF ``DateTimeOriginal`` (with ``SubSecTimeOriginal``: ``SubSecDateTimeOriginal``)
2. EXIF ``CreateDate`` (``DateTimeDigitized``, with ``SubSecTimeDigitized``), then a raw's own
   clock where it keeps it outside EXIF (Canon CRW ``CanonRaw:DateTimeOriginal`` and the others of
   :data:`photos.raw_clocks.RAW_CLOCKS`)
3. XMP ``exif:DateTimeOriginal``, then ``xmp:CreateDate``, then ``photoshop:DateCreated``
4. IPTC ``DateCreated`` + ``TimeCreated``
5. QuickTime/HEIC: ``Keys:CreationDate`` (local, with its zone), then ``QuickTime:CreateDate``
   (UTC by the QuickTime spec: turned into this machine's local time)
6. the photo's XMP sidecar (``NAME.EXT.xmp``, ``NAME.xmp``): its ``exif:DateTimeOriginal``,
   ``xmp:CreateDate``, ``photoshop:DateCreated``
7. GPS ``GPSDateStamp`` + ``GPSTimeStamp`` (UTC from the satellites: turned into local time)
8. none: the caller falls back to the file time recorded at submission (``taken_from`` "file time")

A camera raw is never written, so its edited metadata (a time shift) lives in its sidecar: for a
raw the sidecar (6) comes first, then its own sources in the order above.

Times are the wall-clock time the camera recorded (a zone written beside it is not applied); a
date without a time of day, a zero date (``0000:00:00``) or an unparseable value is no capture
time and the next source is tried. Everything is read from the file's headers (exiftool through the
worker's shared ``-stay_open`` process; Pillow's EXIF reader for the common case, a file with
``DateTimeOriginal``); no pixel is decoded.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from photos import exiftool
from photos.companions import companions
from photos.errors import PhotoError
from photos.image_open import open_image
from photos.raw import is_raw
from photos.raw_clocks import RAW_CLOCKS, raw_clock_args

FILE_TIME = "file time"

#: (label, exiftool key in ``-G0:1`` output without the group-1 part where it does not matter,
#: sub-second key, is UTC). Order is the priority of the module docstring (the sidecar is apart).
_FILE_SOURCES: tuple[tuple[str, tuple[str, ...], str | None, bool], ...] = (
    ("EXIF DateTimeOriginal", ("EXIF:DateTimeOriginal",), "EXIF:SubSecTimeOriginal", False),
    ("EXIF CreateDate", ("EXIF:CreateDate",), "EXIF:SubSecTimeDigitized", False),
    *((f"{raw} {key}", (key,), None, False) for raw, key in RAW_CLOCKS),
    ("XMP exif:DateTimeOriginal", ("XMP-exif:DateTimeOriginal",), None, False),
    ("XMP xmp:CreateDate", ("XMP-xmp:CreateDate",), None, False),
    ("XMP photoshop:DateCreated", ("XMP-photoshop:DateCreated",), None, False),
    ("IPTC DateCreated+TimeCreated", ("IPTC:DateCreated", "IPTC:TimeCreated"), None, False),
    ("QuickTime CreationDate", ("Keys:CreationDate",), None, False),
    ("QuickTime CreateDate (UTC)", ("QuickTime:CreateDate",), None, True),
)
_GPS_SOURCE = ("GPS date/time (UTC)", ("GPS:GPSDateStamp", "GPS:GPSTimeStamp"), None, True)
_SIDECAR_SOURCES = (
    ("sidecar exif:DateTimeOriginal", ("XMP-exif:DateTimeOriginal",), None, False),
    ("sidecar xmp:CreateDate", ("XMP-xmp:CreateDate",), None, False),
    ("sidecar photoshop:DateCreated", ("XMP-photoshop:DateCreated",), None, False),
)
_FILE_TAGS = (
    "-EXIF:DateTimeOriginal", "-EXIF:SubSecTimeOriginal", "-EXIF:CreateDate", "-EXIF:SubSecTimeDigitized",
    "-XMP-exif:DateTimeOriginal", "-XMP-xmp:CreateDate", "-XMP-photoshop:DateCreated",
    "-IPTC:DateCreated", "-IPTC:TimeCreated", "-Keys:CreationDate", "-QuickTime:CreateDate",
    "-GPS:GPSDateStamp", "-GPS:GPSTimeStamp", *raw_clock_args(),
)  # fmt: skip
_SIDECAR_TAGS = ("-XMP-exif:DateTimeOriginal", "-XMP-xmp:CreateDate", "-XMP-photoshop:DateCreated")

_DATE_TIME = re.compile(
    r"^\s*(?P<y>\d{4})[:-](?P<mo>\d{2})[:-](?P<d>\d{2})[ T](?P<h>\d{2}):(?P<mi>\d{2})(?::(?P<s>\d{2}))?"
    r"(?:\.(?P<frac>\d+))?\s*(?P<zone>Z|[+-]\d{2}:?\d{2})?\s*$"
)
_EXIF_IFD, _DATETIME_ORIGINAL, _SUBSEC_ORIGINAL = 0x8769, 0x9003, 0x9291


@dataclass(frozen=True)
class CaptureTime:
    """A capture time: ``taken`` (ISO ``YYYY-MM-DDTHH:MM:SS``, local wall clock; None when no source
    has one), ``subsec`` (the digits after the second, e.g. ``"047"``; None when not recorded) and
    ``source`` (which of the sources of the module docstring; :data:`FILE_TIME` when none)."""

    taken: str | None
    subsec: str | None
    source: str

    def facts(self) -> dict[str, Any]:
        """As analysis facts: ``taken``, ``taken_subsec``, ``taken_from``."""
        return {"taken": self.taken, "taken_subsec": self.subsec, "taken_from": self.source}


NONE = CaptureTime(None, None, FILE_TIME)


def order_key(taken: str | None, subsec: str | None) -> tuple[str, float]:
    """Sort key of a capture time with its sub-seconds: a burst in one second sorts by sub-seconds
    (``"5"`` is half a second, ``"047"`` 47 ms); no sub-seconds sorts first in its second."""
    digits = re.sub(r"\D", "", subsec or "")
    return (taken or "", float("0." + digits) if digits else -1.0)


def parse(value: object, *, utc: bool = False) -> tuple[str, str | None] | None:
    """``"2021:07:04 18:30:05.047+02:00"`` -> ``("2021-07-04T18:30:05", "047")``; None for a missing,
    zero, date-only or malformed value. ``utc``: the value is UTC and becomes this machine's local time."""
    if value in (None, ""):
        return None
    match = _DATE_TIME.match(str(value))
    if match is None:
        return None
    try:
        when = datetime(
            int(match["y"]), int(match["mo"]), int(match["d"]),
            int(match["h"]), int(match["mi"]), int(match["s"] or 0),
        )  # fmt: skip
    except ValueError:  # a zero date, a 25th hour
        return None
    if utc:
        when = when.replace(tzinfo=UTC).astimezone().replace(tzinfo=None)
    return when.isoformat(), match["frac"]


def _subsec(value: object) -> str | None:
    digits = re.sub(r"\D", "", str(value)) if value not in (None, "") else ""
    return digits or None


def _pick(
    record: Mapping[str, Any], sources: tuple[tuple[str, tuple[str, ...], str | None, bool], ...]
) -> CaptureTime | None:
    for label, keys, subsec_key, utc in sources:
        values = [record.get(k) for k in keys]
        if any(v in (None, "") for v in values):
            continue
        text = " ".join(str(v) for v in values)
        if len(keys) == 2:  # a date and a time in two tags (IPTC, GPS)
            text = str(values[0])[:10] + " " + str(values[1])
        parsed = parse(text, utc=utc)
        if parsed is None:
            continue
        taken, frac = parsed
        sub = _subsec(record.get(subsec_key)) if subsec_key else None
        return CaptureTime(taken, sub or frac, label)
    return None


def _keyed(record: Mapping[str, Any]) -> dict[str, Any]:
    """exiftool's ``-G0:1`` keys (``EXIF:ExifIFD:DateTimeOriginal``) as this module names them:
    ``EXIF:DateTimeOriginal`` (group 0), and for XMP, Keys, QuickTime and GPS by group 1."""
    out: dict[str, Any] = {}
    for key, value in record.items():
        parts = key.split(":")
        if len(parts) == 2:  # exiftool writes one group where both are the same (IPTC:IPTC)
            parts.insert(1, parts[0])
        if len(parts) != 3:
            continue
        g0, g1, name = parts
        for alias in (f"{g0}:{name}", f"{g1}:{name}"):
            out.setdefault(alias, value)
    return out


def _exiftool_record(path: Path, tags: tuple[str, ...]) -> dict[str, Any]:
    tool = exiftool.ExifTool.shared()
    out = tool.execute("-j", "-G0:1", *tags, os.path.abspath(path), retry_if_died=True)
    try:
        records = json.loads(out, parse_int=str, parse_float=str) if out.strip() else [{}]
        return _keyed(records[0])
    except (ValueError, IndexError, TypeError, AttributeError) as exc:
        raise PhotoError(path, "exiftool gave unreadable output for the file") from exc


def _pillow_fast_path(path: Path) -> CaptureTime | None:
    """The common case without starting exiftool: a file Pillow opens whose EXIF has
    DateTimeOriginal (the first source); None when Pillow cannot say."""

    try:
        with open_image(path) as img:
            sub = img.getexif().get_ifd(_EXIF_IFD)
            parsed = parse(_text(sub.get(_DATETIME_ORIGINAL)))
            if parsed is None:
                return None
            subsec = _subsec(_text(sub.get(_SUBSEC_ORIGINAL))) or parsed[1]
            return CaptureTime(parsed[0], subsec, _FILE_SOURCES[0][0])
    except Exception:  # noqa: BLE001 - a format Pillow does not read: exiftool decides
        return None


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    return value.replace("\x00", "").strip() if isinstance(value, str) else None


def _sidecar_time(photo: Path) -> CaptureTime | None:
    for sidecar in companions(photo):
        try:
            found = _pick(_exiftool_record(sidecar, _SIDECAR_TAGS), _SIDECAR_SOURCES)
        except PhotoError:
            continue  # an unreadable sidecar is not a capture time
        if found is not None:
            return found
    return None


def read_capture_time(
    path: str | os.PathLike[str], *, located: str | os.PathLike[str] | None = None
) -> CaptureTime:
    """The photo's capture time from its own headers and sidecar, in the module's priority; :data:`NONE`
    (``taken`` None, source "file time") when no source has one. ``path`` is where the bytes are
    read (a pinned name); ``located`` the photo's real path, where its sidecars are found (default
    ``path``). Raises :class:`PhotoError` only when exiftool is needed and fails for the file."""
    path = Path(path)
    photo = Path(located) if located is not None else path
    raw = is_raw(photo)
    if raw:
        found = _sidecar_time(photo)
        if found is not None:
            return found
    else:
        found = _pillow_fast_path(path)
        if found is not None:
            return found
    if not exiftool.available():
        return NONE
    record = _exiftool_record(path, _FILE_TAGS)
    found = _pick(record, _FILE_SOURCES)
    if found is None and not raw:
        found = _sidecar_time(photo)
    if found is None:
        found = _pick(record, (_GPS_SOURCE,))
    return found or NONE
