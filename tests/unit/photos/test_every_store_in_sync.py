"""No store left stale, nothing unasked added (issue 40): a PNG's IPTC gets the edit with XMP; a
second IPTC block's clocks move with the first's; no ``IFD0:YCbCrPositioning`` is added; a shift
leaves Pentax's ShutterCount as it was (its Date and Time, which encrypt it, are left and named);
a maker note's clock that is no date is left and named alike in a JPEG and a WebP; an emoji keyword
is left out of ``XPKeywords`` (UCS-2) and named, never written as junk."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from photos.exif import ExifEdit, exiftool_args, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from tests import clock_photos
from tests.fixtures import camera_corpus as cc
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")


def _tags(path: Path, *tags: str) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", *tags, os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    record.pop("SourceFile", None)
    return record


def _run(*args: str) -> None:
    ExifTool.shared().execute("-overwrite_original", *args)


def test_a_png_iptc_block_gets_the_new_caption_and_keywords_with_xmp(tmp_path: Path) -> None:
    """Given a PNG carrying an IPTC block (caption and keywords) beside its XMP
    When keywords and a description are written
    Then IPTC holds exactly what XMP holds"""
    src = tmp_path / "scan.png"
    cc._pattern_image((48, 32), 2).save(src, "PNG")
    _run("-IPTC:Keywords=Old", "-IPTC:Caption-Abstract=Old caption", "-XMP-dc:Subject=Old", str(src))
    dst = staged_path(src, "t1")
    write_metadata(src, dst, ExifEdit(keywords=["New"], description="New caption"))
    after = _tags(dst, "-IPTC:Keywords", "-XMP-dc:Subject", "-IPTC:Caption-Abstract", "-XMP-dc:Description")
    assert after["IPTC:Keywords"] == after["XMP-dc:Subject"] == ["Old", "New"]
    assert after["IPTC:Caption-Abstract"] == after["XMP-dc:Description"] == "New caption"


def test_a_second_iptc_blocks_clock_is_shifted_too(tmp_path: Path) -> None:
    """Given a JPEG with two IPTC blocks (two APP13 segments) holding the same clock
    When it is shifted by +1h
    Then both blocks hold the shifted clock and the result names none as unshifted"""
    src = tmp_path / "twice.jpg"
    cc._pattern_image((48, 32), 2).save(src, "JPEG", quality=90)
    _run("-IPTC:DateCreated=2005:04:23", "-IPTC:TimeCreated=10:00:00", str(src))
    data = src.read_bytes()
    at = data.find(b"\xff\xed")
    end = at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    src.write_bytes(data[:end] + data[at:end] + data[end:])
    assert "IPTC2:TimeCreated" in _tags(src, "-time:all")
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    after = _tags(dst, "-time:all")
    assert after["IPTC:TimeCreated"] == after["IPTC2:TimeCreated"] == "11:00:00"
    assert "unshifted" not in written.result()


def test_a_shift_leaves_pentax_shutter_count_as_it_was(tmp_path: Path) -> None:
    """Given a Pentax JPEG whose ShutterCount (5074) is encrypted with its maker note's Date and Time
    When it is shifted by +1h
    Then the count reads 5074 still, the EXIF clocks moved, and Pentax's Date and Time are named"""
    src = clock_photos.camera_jpeg(tmp_path / "IMGP0001.JPG", "pentax", shutter_count=5074)
    assert _tags(src, "-Pentax:ShutterCount")["Pentax:ShutterCount"] == "5074"
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    after = _tags(dst, "-Pentax:ShutterCount", "-ExifIFD:DateTimeOriginal")
    assert after["Pentax:ShutterCount"] == "5074"
    assert after["ExifIFD:DateTimeOriginal"] == "2004:10:03 00:29:52"
    assert written.result()["unshifted"] == ["Pentax:Date", "Pentax:Time"]


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP"])
def test_a_maker_clock_that_is_no_date_is_left_and_named_in_every_format(tmp_path: Path, fmt: str) -> None:
    """Given a Nikon photo (JPEG, or WebP with the same EXIF) whose PowerUpTime is no valid date
    When it is shifted by +1h
    Then it is written, the capture clocks moved, and Nikon:PowerUpTime is named as unshifted"""
    jpeg = clock_photos.camera_jpeg(tmp_path / "DSC_0001.JPG", "nikon")
    _run("-Nikon:PowerUpTime=2004:10:02 23:29:52", str(jpeg))
    data = jpeg.read_bytes()
    # a month 13: exiftool reads it as a date/time but cannot shift it
    jpeg.write_bytes(
        data.replace(bytes([0xD4, 0x07, 10, 2, 23, 29, 52]), bytes([0xD4, 0x07, 13, 2, 23, 29, 52]), 1)
    )
    assert _tags(jpeg, "-Nikon:PowerUpTime")["Nikon:PowerUpTime"].startswith("2004:13:02")
    src = jpeg
    if fmt == "WEBP":
        src = tmp_path / "DSC_0001.webp"
        with Image.open(jpeg) as img:
            img.save(src, "WEBP", lossless=True, exif=img.info["exif"])
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    assert _tags(dst, "-ExifIFD:DateTimeOriginal")["ExifIFD:DateTimeOriginal"] == "2004:10:03 00:29:52"
    assert written.result()["unshifted"] == ["Nikon:PowerUpTime"]


def test_an_emoji_keyword_is_left_out_of_xpkeywords_and_named(tmp_path: Path) -> None:
    """Given a JPEG with EXIF (so XPKeywords is written)
    When the keywords "🏖️ Beach" and "Plain" are added
    Then XMP holds both, XPKeywords only "Plain" (no junk), and the result names the one left out"""
    src = clock_photos.camera_jpeg(tmp_path / "IMG_1.JPG", "nikon")
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, ExifEdit(keywords=["🏖️ Beach", "Plain"]))
    after = _tags(dst, "-XMP-dc:Subject", "-IFD0:XPKeywords")
    assert after["XMP-dc:Subject"] == ["🏖️ Beach", "Plain"]
    assert after["IFD0:XPKeywords"] == "Plain"
    assert written.result()["xpkeywords_left_out"] == ["🏖️ Beach"]


def test_no_ycbcr_positioning_is_added_to_an_exif_block(tmp_path: Path) -> None:
    """Given a PNG's tags without IFD0:YCbCrPositioning (exiftool adds it to an IFD0 it creates)
    When keywords are written into its EXIF
    Then the arguments delete it (a no-op where it is absent), and a real PNG gains no such tag"""
    args = exiftool_args(ExifEdit(keywords=["New"]), fmt="PNG", current={"ExifIFD:DateTimeOriginal": "x"})
    assert "-IFD0:YCbCrPositioning=" in args
    src = tmp_path / "eXIf.png"
    exif = Image.Exif()
    exif.get_ifd(0x8769)[0x9003] = "2005:04:23 10:00:00"
    cc._pattern_image((48, 32), 2).save(src, "PNG", exif=exif.tobytes())
    dst = staged_path(src, "t1")
    write_metadata(src, dst, ExifEdit(keywords=["New"]))
    assert "IFD0:YCbCrPositioning" not in _tags(dst, "-EXIF:all")
