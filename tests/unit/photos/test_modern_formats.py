"""Modern formats (issue 28): AVIF, WebP and JPEG XL metadata written where exiftool (the pinned
13.x) writes it: XMP always, EXIF where the file has an EXIF block; the pixels, every other tag and
the file time kept. A bare JPEG XL codestream (no room for metadata) is wrapped in the JPEG XL
container by exiftool, and the result says so."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from photos.exif import ExifEdit, read_metadata, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from photos.formats import sniff_format
from tests.fixtures import metadata_files
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")

EDIT = ExifEdit(keywords=["Plage", "Été"], description="Low tide", rating=4, shift=timedelta(hours=2))
ASKED = {"Subject", "Description", "Rating", "XMPToolkit", "ModifyDate", "DateTimeOriginal", "CreateDate"}
# the container's own bookkeeping: AVIF keeps image and metadata items in one 'mdat' (a write
# relocates the items; the pixels are compared), WebP's VP8X flags say "has XMP" once it has
CONTAINER = {"MediaData", "MediaDataSize", "MediaDataOffset", "WebP_Flags"}


def _dump(path: Path) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", "-u", "-b", os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    derived = ("SourceFile", "System:", "File:", "Composite:")
    return {k: v for k, v in record.items() if not k.startswith(derived)}


@pytest.mark.parametrize("fmt, suffix", [("AVIF", ".avif"), ("WEBP", ".webp"), ("JXL", ".jxl")])
def test_modern_formats_get_xmp_and_their_exif_edited_and_nothing_else(
    tmp_path: Path, fmt: str, suffix: str
) -> None:
    # Given a photo of the format with a camera EXIF block (DateTimeOriginal 2005:08:13 09:47:23)
    src = metadata_files.modern_photo(tmp_path / f"photo{suffix}", fmt)
    assert sniff_format(src.read_bytes()[:64]) == fmt
    before, mtime = _dump(src), src.stat().st_mtime_ns
    dst = staged_path(src, "t1")
    # When keywords, a description, a rating and a shift are written
    write_metadata(src, dst, EDIT)
    # Then photo apps read them from XMP, the EXIF clocks moved
    after = _dump(dst)
    meta = read_metadata(dst)
    assert (meta["keywords"], meta["description"], meta["rating"]) == (["Plage", "Été"], "Low tide", 4)
    assert after["ExifIFD:DateTimeOriginal"] == "2005:08:13 11:47:23"
    assert after["IFD0:ImageDescription"] == "Low tide"
    # and nothing else changed: the other tags, the pixels, the file time
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    allowed = ASKED | CONTAINER | {"XPKeywords", "ImageDescription"}
    assert {k.split(":", 1)[-1] for k in changed} <= allowed, changed
    assert metadata_files.pixels(dst) == metadata_files.pixels(src)
    assert dst.stat().st_mtime_ns == mtime


def test_a_bare_jpeg_xl_codestream_is_wrapped_in_its_container_to_hold_xmp(tmp_path: Path) -> None:
    # Given a JPEG XL codestream (no container, no EXIF)
    src = metadata_files.modern_photo(tmp_path / "bare.jxl", "JXL", with_exif=False)
    assert src.read_bytes()[:2] == b"\xff\x0a"
    dst = staged_path(src, "t1")
    # When keywords are written
    written = write_metadata(src, dst, ExifEdit(keywords=["Plage"]))
    # Then exiftool put the codestream in the container with an XMP box, and the result says so
    assert dst.read_bytes()[:12] == b"\x00\x00\x00\x0cJXL \r\n\x87\n"
    assert read_metadata(dst)["keywords"] == ["Plage"]
    assert written.fixed and "JXL codestream" in written.fixed[0]
    assert metadata_files.pixels(dst) == metadata_files.pixels(src)
