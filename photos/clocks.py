"""A time shift: the ``shift`` parameter, and the exiftool arguments that move every clock a file has.

Every clock exiftool reads (``-time:all``) moves, each in its own group and form: a full date/time
through exiftool's own shift (``+=``, its zone and form kept: ``2023:09:27 14:35:33``,
``2023-09-27T14:35:33+02:00`` alike); a date and a time kept in two tags (IPTC
``DateCreated``/``TimeCreated``, ``DigitalCreationDate``/``DigitalCreationTime``, Pentax
``Date``/``Time``) together so the day rolls over; a date split over three maker-note tags (Kodak
``YearCreated``/``MonthDayCreated``/``TimeCreated``) together the same way. A clock exiftool reads
but cannot write (``Samsung:TimeStamp`` in a Samsung phone's trailer) is left as it is and
reported, never a reason to refuse the file (:mod:`photos.exiftool_messages`). Left alone: file
system times, GPS (UTC from the satellites), ICC profile dates, the XMP editing history, a lone
time, a year (and month) alone, and all-zero "unknown" dates.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from photos.errors import InvalidParameter, PhotoError

_SHIFT_RE = re.compile(r"^([+-]?)(?=\d)(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
MAX_SHIFT = timedelta(days=365 * 200)
EXIF_DT_FORMAT = "%Y:%m:%d %H:%M:%S"

#: Clock groups a shift leaves alone: file system times, computed tags, GPS time (UTC from the
#: satellites, not the camera's clock), the ICC profile's creation date (not the photo's) and the
#: XMP media-management history (a log of past saves, kept in structures exiftool cannot shift).
_UNSHIFTED_GROUPS = (
    "System",
    "File",
    "Composite",
    "ExifTool",
    "GPS",
    "ICC-header",
    "ICC_Profile",
    "XMP-xmpMM",
)
#: IPTC dates that are not the photo's clocks (transmission, release, expiry of the record).
_UNSHIFTED_TAGS = frozenset(
    {
        "DateSent",
        "TimeSent",
        "ReleaseDate",
        "ReleaseTime",
        "ExpirationDate",
        "ExpirationTime",
        "GPSDateTime",
        "GPSDateStamp",
        "GPSTimeStamp",
    }
)
_DATE_ONLY = re.compile(r"^\d{4}:\d{2}:\d{2}$")
_YEAR_OR_MONTH = re.compile(r"^\d{4}(:\d{2})?$")  # XMP dates of reduced precision
_DATE_TIME = re.compile(r"^\d{4}[:-]\d{2}[:-]\d{2}[ T]\d{2}:\d{2}")
#: A date/time exiftool shifts: EXIF form or ISO 8601 form, the minutes at least; what follows the
#: (optional) seconds is sub-seconds or a zone, never another digit.
_SHIFTABLE = re.compile(r"^(\d{4})[:-](\d{2})[:-](\d{2})[ T](\d{2}):(\d{2})(?::(\d{2}))?(?!\d)")
#: The capture/digitized/modify dates: one of these holding something that is not a date/time
#: refuses the file (it cannot be shifted). Other time tags whose value is no date/time (offsets
#: such as OffsetTime "+02:00", SubSecTime "123", a maker note's world-time city) are no clocks.
_CLOCK_NAMES = frozenset(
    {"DateTimeOriginal", "CreateDate", "ModifyDate", "DateTimeDigitized", "DateCreated", "DateTime"}
)
_TIME_ONLY = re.compile(r"^(\d{2}:\d{2}:\d{2})(\.\d+)?([+-]\d{2}:?\d{2}|Z)?$")
#: A date and time split over three tags of one group (year; month:day; time), shifted as one.
SPLIT_CLOCKS = (("YearCreated", "MonthDayCreated", "TimeCreated"),)  # Kodak maker notes
_MONTH_DAY = re.compile(r"^(\d{1,2}):(\d{1,2})$")


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
    if delta > MAX_SHIFT:
        raise InvalidParameter(f"time shift {text!r} is larger than 200 years")
    return -delta if m.group(1) == "-" else delta


#: Groups whose clocks are the photo's standard ones: one that cannot be shifted refuses the photo.
#: A maker note's clock (any other group) that cannot be shifted is left and named instead.
_STANDARD_GROUPS = re.compile(
    r"^(IFD\d*|ExifIFD|SubIFD\d*|XMP-.*|IPTC\d*|PNG|QuickTime|Keys|ItemList|UserData|Photoshop)$"
)
_IPTC_COPY = re.compile(r"^IPTC(\d+)$")
#: Clocks that encode another fact: shifting them would change it (Pentax encrypts its ShutterCount
#: with its Date and Time). (the fact's tag, the clocks left as they were).
ENCODING_CLOCKS = (("Pentax:ShutterCount", ("Pentax:Date", "Pentax:Time")),)


def clock_args(
    shift: timedelta, clocks: Mapping[str, Any], path: Path, unshifted: list[str] | None = None
) -> list[str]:
    """exiftool arguments moving every clock of the file by ``shift``.

    ``clocks`` is ``-time:all`` read with ``-j -G1 -a``: EXIF (IFD0, ExifIFD, IFD1 …), XMP, IPTC,
    PNG, QuickTime and maker-note dates alike. A full date/time is shifted by exiftool (``+=``,
    its zone and form kept); a date and a time kept apart (IPTC DateCreated/TimeCreated,
    DigitalCreationDate/Time, Pentax Date/Time) are shifted together so the day rolls over, and
    written back with exactly the zone they had (none if none); a date split over three tags
    (:data:`SPLIT_CLOCKS`) likewise. A lone date moves only by whole days; a lone time, or a year
    (and month) alone, stays. All-zero dates ("unknown") stay; a date that cannot be shifted
    raises PhotoError. File system times, GPS (UTC), ICC profile dates and the XMP editing history
    (``xmpMM``: a log of past saves) are left alone. A clock exiftool cannot write is named in
    these arguments all the same: exiftool skips it with a warning the caller reports.

    ``unshifted`` (when given) receives the clocks left as they were on purpose: a maker note's
    clock that is not a date/time exiftool can shift (a standard one refuses the photo), and the
    clocks that encode another fact (:data:`ENCODING_CLOCKS`: Pentax's Date and Time, with which
    its ShutterCount is encrypted). A second IPTC block (``IPTC2``) is written by exiftool with the
    first block's values, so its clocks move with the first's; blocks that disagree refuse."""
    sign, amount = exiftool_shift(shift)
    args: list[str] = []
    tags: dict[str, Any] = {}
    kept: list[str] = unshifted if unshifted is not None else []
    encoding = {c for fact, held in ENCODING_CLOCKS if fact in clocks for c in held}
    for key, value in clocks.items():
        if ":" not in key:
            continue
        group, name = key.split(":", 1)
        if group in _UNSHIFTED_GROUPS or name in _UNSHIFTED_TAGS or group.startswith("ICC"):
            continue
        if key in encoding:
            if _has_time(value) and key not in kept:
                kept.append(key)
            continue
        if _IPTC_COPY.match(group):
            if str(clocks.get(f"IPTC:{name}", "")).strip() != str(value).strip():
                raise PhotoError(
                    path, f"cannot shift {key}: the file's IPTC blocks disagree on {name} "
                    "(exiftool writes one value into every block)",
                )  # fmt: skip
            continue  # exiftool writes the first block's shifted value into this copy too
        tags[key] = value
    paired: set[str] = set()
    for key in tags:
        group, name = key.split(":", 1)
        for year_tag, month_day_tag, time_tag in SPLIT_CLOCKS:
            if name != year_tag:
                continue
            split = [f"{group}:{year_tag}", f"{group}:{month_day_tag}", f"{group}:{time_tag}"]
            if all(k in tags for k in split):
                args += _split_clock_args(path, split, [str(tags[k]).strip() for k in split], shift)
                paired |= set(split)
    for key, value in tags.items():
        group, name = key.split(":", 1)
        text = str(value).strip()
        if key in paired or "Date" not in name or not _DATE_ONLY.match(text) or not _has_time(text):
            continue
        partner = f"{group}:{name.replace('Date', 'Time')}"
        time_text = str(tags.get(partner, "")).strip()
        match = _TIME_ONLY.match(time_text)
        if partner != key and match:
            moved = shift_parts(path, key, text, match.group(1), shift)
            args += [f"-{key}={moved[0]}", f"-{partner}={moved[1]}{match.group(3) or ''}"]
            paired |= {key, partner}
        elif not shift % timedelta(days=1):
            moved = shift_parts(path, key, text, "00:00:00", shift)
            args.append(f"-{key}={moved[0]}")
            paired.add(key)
    for key, value in tags.items():
        if key in paired:
            continue
        if isinstance(value, list) or not _has_time(value) or _partial(value):
            continue  # a list (the XMP editing history), a lone date/time: nothing to roll over
        if not _DATE_TIME.match(str(value).strip()) and name_of(key) not in _CLOCK_NAMES:
            continue  # a time zone offset, sub-seconds, a city: not a clock
        try:
            check_date(path, key, value, shift)
        except PhotoError:
            if _STANDARD_GROUPS.match(key.split(":", 1)[0]):
                raise
            if key not in kept:  # a maker note's clock that is no date/time: left, and named
                kept.append(key)
            continue
        args.append(f"-{key}{sign}={amount}")
    return args


def shifted_tags(args: list[str]) -> set[str]:
    """The ``GROUP:TAG`` names a list of :func:`clock_args` arguments writes."""
    return {re.split(r"[-+]?=", a[1:], maxsplit=1)[0] for a in args if a.startswith("-") and "=" in a}


def name_of(key: str) -> str:
    """``"ExifIFD:DateTimeOriginal"`` -> ``"DateTimeOriginal"``."""
    return key.split(":", 1)[-1]


def _partial(value: Any) -> bool:
    """A date without a time, a time without a date, or only a year (and month)."""
    text = str(value).strip()
    return bool(_DATE_ONLY.match(text) or _TIME_ONLY.match(text) or _YEAR_OR_MONTH.match(text))


def shift_parts(path: Path, key: str, date: str, time: str, shift: timedelta) -> tuple[str, str]:
    """A date and a time kept in two tags, shifted together so the date rolls over correctly."""
    try:
        moved = datetime.strptime(f"{date[:10]} {time[:8]}", EXIF_DT_FORMAT) + shift
    except (ValueError, OverflowError) as exc:
        raise PhotoError(path, f"cannot shift {key}: its date and time are not a valid date/time") from exc
    if not 1 <= moved.year <= 9999:
        raise PhotoError(path, f"cannot shift {key}: shifted by {shift} it leaves the years 1-9999")
    return moved.strftime("%Y:%m:%d"), moved.strftime("%H:%M:%S")


def _split_clock_args(path: Path, keys: list[str], values: list[str], shift: timedelta) -> list[str]:
    """A year, a month:day and a time in three tags (Kodak's maker note), moved as one date/time;
    the time's hundredths are kept."""
    year, month_day, time = values
    md = _MONTH_DAY.match(month_day)
    tm = _TIME_ONLY.match(time)
    if not year.isdigit() or md is None or tm is None:
        raise PhotoError(path, f"cannot shift {keys[0]}: {', '.join(keys)} are not a date and a time")
    if not int(year) or not int(md.group(1)):
        return []  # all-zero: "unknown", left as it is
    date = f"{int(year):04d}:{int(md.group(1)):02d}:{int(md.group(2)):02d}"
    new_date, new_time = shift_parts(path, keys[0], date, tm.group(1), shift)
    y, m, d = new_date.split(":")
    return [f"-{keys[0]}={int(y)}", f"-{keys[1]}={m}:{d}", f"-{keys[2]}={new_time}{tm.group(2) or ''}"]


def _has_time(value: Any) -> bool:
    """False for blank or all-zero dates ("0000:00:00 00:00:00" means unknown): left unshifted."""
    text = str(value).strip()
    return bool(text) and not set(text) <= set("0: ")


def check_date(path: Path, key: str, value: Any, shift: timedelta) -> None:
    """Refuse a date exiftool could not shift (it would skip it with a warning). The EXIF form
    (``2023:09:27 14:35:33``) and the ISO 8601 form (``2023-09-27T14:35:33+02:00``) both shift."""
    text = str(value).strip()
    m = _SHIFTABLE.match(text)
    moved = None
    if m:
        try:
            moved = datetime(*(int(m.group(i) or 0) for i in range(1, 7))) + shift
        except (ValueError, OverflowError):
            moved = None
    if moved is None:
        raise PhotoError(
            path, f"cannot shift {key}: its {len(text)} characters are not a date/time (YYYY:MM:DD HH:MM:SS)"
        )
    if not 1 <= moved.year <= 9999:
        raise PhotoError(path, f"cannot shift {key}: shifted by {shift} it leaves the years 1-9999")


def exiftool_shift(delta: timedelta) -> tuple[str, str]:
    """("+" or "-", "0:0:D H:M:S") for exiftool's date shift syntax."""
    sign = "-" if delta < timedelta(0) else "+"
    total = int(abs(delta).total_seconds())
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    return sign, f"0:0:{days} {hours}:{minutes}:{seconds}"
