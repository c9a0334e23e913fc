"""IPTC (IIM) as the exif lane writes it: UTF-8, its length limits, and older blocks converted.

Every IPTC write declares ``CodedCharacterSet=UTF8``. A block written without it (Picasa, old
scanners and cameras) is converted, never refused: its values are read in their *real* charset,
UTF-8 where every value is valid UTF-8 (Picasa writes UTF-8 without saying so), else Latin
(Windows-1252, exiftool's default), and the values the edit does not replace are copied back as
UTF-8 (``-tagsFromFile @``), so their text is kept. IPTC length limits (keyword 64 bytes, by-line
32, copyright 128, caption 2000) cut only the IPTC copy, at a character boundary.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from photos import exiftool

#: IPTC IIM maximum lengths in bytes.
IPTC_LIMITS = {"Keywords": 64, "Caption-Abstract": 2000, "By-line": 32, "CopyrightNotice": 128}
UTF8 = "UTF8"
_BINARY = "(Binary data"


def iptc_cut(tag: str, value: str) -> str:
    """``value`` cut to the IPTC byte limit of ``tag`` at a character boundary."""
    limit = IPTC_LIMITS[tag]
    raw = value.encode("utf-8")
    if len(raw) <= limit:
        return value
    return raw[:limit].decode("utf-8", "ignore")


def _texts(current: Mapping[str, Any]) -> dict[str, Any]:
    """The IPTC values that are text (binary ones are shown as ``(Binary data …)``)."""
    return {
        k: v for k, v in current.items()
        if k.startswith("IPTC:") and not str(v).startswith(_BINARY) and k != "IPTC:CodedCharacterSet"
    }  # fmt: skip


def _non_ascii(value: Any) -> bool:
    values = value if isinstance(value, list) else [value]
    return any(not str(v).isascii() for v in values)


def source_charset(tool: exiftool.ExifTool, path: Path, current: Mapping[str, Any]) -> str | None:
    """The charset the file's IPTC text really is in: None when it declares UTF-8 or is plain
    ASCII (nothing to convert), ``"UTF8"`` when every non-ASCII value is valid UTF-8 (read again
    as such: exiftool reads an undeclared block as Latin), else ``"Latin"``."""
    if str(current.get("IPTC:CodedCharacterSet", "")) == UTF8:
        return None
    if not any(_non_ascii(v) for v in _texts(current).values()):
        return None
    out = tool.execute(
        "-j", "-G1", "-a", "-b", "-charset", "iptc=utf8", "-IPTC:all", os.path.abspath(path),
        retry_if_died=True,
    )  # fmt: skip
    try:
        record = json.loads(out, parse_int=str, parse_float=str)[0] if out.strip() else {}
    except (ValueError, IndexError):
        return "Latin"
    for key in _texts(current):
        values = record.get(key)
        for v in values if isinstance(values, list) else [values]:
            if isinstance(v, str) and v.startswith("base64:"):
                return "Latin"  # not valid UTF-8 (exiftool gave its bytes)
    return UTF8


def reread_as_utf8(tool: exiftool.ExifTool, path: Path) -> dict[str, Any]:
    """The file's IPTC values read as UTF-8 (``-j -G1 -a``): an undeclared Picasa block's text."""
    out = tool.execute(
        "-j", "-G1", "-a", "-charset", "iptc=utf8", "-IPTC:all", os.path.abspath(path), retry_if_died=True
    )
    record = dict(json.loads(out, parse_int=str, parse_float=str)[0]) if out.strip() else {}
    return {k: v for k, v in record.items() if k.startswith("IPTC:")}


def charset_args(current: Mapping[str, Any], assigned: list[str], source: str | None) -> list[str]:
    """Mark IPTC as UTF-8. A block in another charset (``source``, see :func:`source_charset`;
    None: nothing to convert) is converted: the values the edit does not set or clear
    (``assigned``) are copied back, read in ``source``, written as UTF-8, so their text is kept."""
    args = [f"-IPTC:CodedCharacterSet={UTF8}"]
    if source is None:
        return args
    skip = {"IPTC:CodedCharacterSet", *(f"IPTC:{t.split(':', 1)[-1]}" for t in assigned)}
    kept = [k for k in current if k.startswith("IPTC:") and k not in skip]
    if not kept:
        return args  # every value is replaced: nothing to copy ("No writable tags set")
    exclude = sorted(f"--{k}" for k in skip)
    return ["-charset", f"iptc={source}", "-tagsFromFile", "@", "-IPTC:all", *exclude, *args]
