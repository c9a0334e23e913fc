"""Metadata writes change exactly what was asked, on the camera layouts piexif used to damage.

For every file of the corpus (tests/fixtures/camera_corpus.py: unterminated ASCII tags, EXIF tags in
IFD0, an Interop IFD, compressed and uncompressed IFD1 thumbnails, a MakerNote whose offsets
count from the TIFF header, a UserComment; as JPEG, TIFF, PNG and HEIC) and every kind of write,
exiftool's full dump (``-j -G1 -a -u -b``) before and after is compared: every tag that was not
asked for is identical (binary values included), the asked tags are where photo apps read them,
the pixels (and for JPEG the compressed scan data) and the file's modification time are kept.
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from photos.exif import ExifEdit, jpeg_scan_data, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from tests.fixtures import camera_corpus
from tests.support import IN_CI

if camera_corpus.heic_available():
    import pillow_heif

    pillow_heif.register_heif_opener()

# Under CI=true a missing exiftool is a failure (.ci/run installs it), never a skip.
pytestmark = pytest.mark.skipif(
    not ExifTool().available() and not IN_CI, reason="exiftool is not installed"
)

KEYWORDS = ["beach", "Été à Paris", "東京", "2024"]
DESCRIPTION = "Sunset at the pier — «quoted»\nsecond line"
ARTIST = "Zoë Ångström"
COPYRIGHT = "© 2024 Zoë Ångström"
SHIFT = timedelta(hours=1, minutes=30)

# tags exiftool derives from others, or that describe the file on disk rather than its content
DERIVED_GROUPS = ("Composite:", "System:", "File:CurrentIPTCDigest")
KEPT_SYSTEM = "System:FileModifyDate"
# offsets of data blocks: a rewrite may legitimately move the blocks (their content is compared)
OFFSETS = ("ThumbnailOffset", "StripOffsets")
# HEIC keeps the image and the metadata items in one 'mdat' box: a write relocates the metadata
# items inside it (the coded image bytes are compared on their own)
HEIC_CONTAINER = ("QuickTime:MediaData", "QuickTime:MediaDataSize", "QuickTime:MediaDataOffset")
# the fixed records exiftool adds when it creates an IPTC block (the IPTC standard requires them)
IPTC_STRUCTURE = {"IPTC:EnvelopeRecordVersion", "IPTC:ApplicationRecordVersion", "IPTC:CodedCharacterSet"}


def _dump(path: Path) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", "-u", "-b", os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    record.pop("SourceFile", None)
    return record


def _tag(key: str) -> str:
    return key.split(":", 1)[-1]


def _as_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _shifted(value: str) -> str:
    stamp = datetime.strptime(value[:19], "%Y:%m:%d %H:%M:%S") + SHIFT
    return stamp.strftime("%Y:%m:%d %H:%M:%S") + value[19:]


# Each write: the edit, the tag names it may change, and a check of where it must be visible.
def _check_keywords(before: dict[str, Any], after: dict[str, Any], fmt: str) -> None:
    assert _as_list(after["XMP-dc:Subject"]) == KEYWORDS
    if fmt in ("JPEG", "TIFF"):
        assert _as_list(after["IPTC:Keywords"]) == KEYWORDS
        assert after["IPTC:CodedCharacterSet"] == "UTF8"


def _check_description(before: dict[str, Any], after: dict[str, Any], fmt: str) -> None:
    assert after["XMP-dc:Description"] == DESCRIPTION
    assert after["IFD0:ImageDescription"] == DESCRIPTION
    if fmt in ("JPEG", "TIFF"):
        assert after["IPTC:Caption-Abstract"] == DESCRIPTION


def _check_rating(before: dict[str, Any], after: dict[str, Any], fmt: str) -> None:
    assert str(after["XMP-xmp:Rating"]) == "4"
    # Microsoft's EXIF Rating (non-standard for exiftool -validate) only where the file had one
    assert ("IFD0:Rating" in after) == ("IFD0:Rating" in before)


def _check_artist(before: dict[str, Any], after: dict[str, Any], fmt: str) -> None:
    assert _as_list(after["XMP-dc:Creator"]) == [ARTIST]
    assert after["IFD0:Artist"] == ARTIST
    if fmt in ("JPEG", "TIFF"):
        assert _as_list(after["IPTC:By-line"]) == [ARTIST]


def _check_copyright(before: dict[str, Any], after: dict[str, Any], fmt: str) -> None:
    assert after["XMP-dc:Rights"] == COPYRIGHT
    assert after["IFD0:Copyright"] == COPYRIGHT
    if fmt in ("JPEG", "TIFF"):
        assert after["IPTC:CopyrightNotice"] == COPYRIGHT


def _check_shift(before: dict[str, Any], after: dict[str, Any], fmt: str) -> None:
    for key in ("ExifIFD:DateTimeOriginal", "ExifIFD:CreateDate", "IFD0:ModifyDate"):
        assert after[key] == _shifted(before[key]), f"{key} shifted once"


WRITES: dict[str, tuple[ExifEdit, set[str], Callable[[dict[str, Any], dict[str, Any], str], None]]] = {
    "keywords": (ExifEdit(keywords=KEYWORDS), {"Subject", "Keywords", "XPKeywords"}, _check_keywords),
    "description": (
        ExifEdit(description=DESCRIPTION),
        {"Description", "ImageDescription", "Caption-Abstract"},
        _check_description,
    ),
    "rating": (ExifEdit(rating=4), {"Rating", "RatingPercent"}, _check_rating),
    "artist": (ExifEdit(artist=ARTIST), {"Creator", "Artist", "By-line"}, _check_artist),
    "copyright": (
        ExifEdit(copyright=COPYRIGHT),
        {"Rights", "Copyright", "CopyrightNotice"},
        _check_copyright,
    ),
    "shift": (
        ExifEdit(shift=SHIFT),
        {"DateTimeOriginal", "CreateDate", "ModifyDate", "DateCreated", "TimeCreated", "DateTimeDigitized"},
        _check_shift,
    ),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = camera_corpus.make_corpus(tmp_path_factory.mktemp("corpus"))
    for path in made.values():
        path.chmod(0o640)  # not the default: the copy must take the photo's own permissions
    return made


def _labels() -> list[str]:
    labels = [f"jpeg-{p}" for p in camera_corpus.PATTERNS] + ["tiff-everything", "png-everything"]
    return [*labels, "heic-everything"] if camera_corpus.heic_available() else labels


def _heic_coded_image(dump: dict[str, Any]) -> bytes:
    """The coded (HEVC) image bytes of a corpus HEIC: its 'mdat' up to the Exif item."""
    mdat = base64.b64decode(dump["QuickTime:MediaData"][len("base64:") :])
    exif_item = mdat.find(b"Exif\x00\x00") - 4
    assert exif_item > 1000, "pillow-heif stores the image before the Exif item"
    return mdat[:exif_item]


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("label", _labels())
def test_a_write_changes_only_the_asked_tags(corpus: dict[str, Path], label: str, write: str) -> None:
    # Given a camera file with one of the odd layouts real cameras write
    src = corpus[label]
    fmt = {"jpeg": "JPEG", "tiff": "TIFF", "png": "PNG", "heic": "HEIF"}[label.split("-")[0]]
    edit, asked, check = WRITES[write]
    before = _dump(src)
    src_bytes, src_mtime = src.read_bytes(), src.stat().st_mtime_ns
    thumb_strip = camera_corpus.ifd1_strip(src) if fmt == "JPEG" else None
    dst = staged_path(src, f"i1-t{write}")
    # When one field is written to the staged copy
    write_metadata(src, dst, edit)
    after = _dump(dst)
    # Then every tag that was not asked for is identical, binary values included
    changed = {}
    for key in sorted(set(before) | set(after)):
        if key.startswith(DERIVED_GROUPS) and key != KEPT_SYSTEM:
            continue
        if _tag(key) in asked or _tag(key) in OFFSETS or key in HEIC_CONTAINER:
            continue
        if key in IPTC_STRUCTURE and not any(k.startswith("IPTC:") for k in before):
            continue  # created with the IPTC block
        if before.get(key) != after.get(key):
            changed[key] = (before.get(key), after.get(key))
    assert changed == {}, f"{label}: {write} changed tags it was not asked to touch"
    # and the asked tags are where photo apps read them
    check(before, after, fmt)
    # and the image data, the thumbnails and the modification time are kept, the source untouched
    if fmt == "JPEG":
        assert jpeg_scan_data(dst.read_bytes()) == jpeg_scan_data(src_bytes)
        assert camera_corpus.ifd1_strip(dst) == thumb_strip
    if fmt == "HEIF":
        assert _heic_coded_image(before) in base64.b64decode(after["QuickTime:MediaData"][7:])
    assert np.array_equal(_pixels(src), _pixels(dst))
    assert dst.stat().st_mtime_ns == src_mtime
    assert dst.stat().st_mode == src.stat().st_mode
    assert after["ExifIFD:UserComment"] == before["ExifIFD:UserComment"]
    assert src.read_bytes() == src_bytes and src.stat().st_mtime_ns == src_mtime
