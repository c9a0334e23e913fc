"""Capture time from every source, one source at a time, in the documented priority; the source
used is reported (``taken_from``) and the sub-seconds kept for ordering a burst."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from PIL import Image

from photos.capture_time import _FILE_SOURCES, FILE_TIME, _keyed, _pick, order_key, read_capture_time
from photos.rename import taken_now
from tests.raw_support import make_raw
from tests.support import IN_CI

# Under CI=true a missing exiftool is a failure (.ci/run installs it), never a skip.
pytestmark = pytest.mark.skipif(
    subprocess.run(["which", "exiftool"], capture_output=True).returncode != 0 and not IN_CI,
    reason="needs exiftool",
)


def local(utc_text: str) -> str:
    """A UTC time as this machine's local wall clock (how UTC sources are reported)."""
    when = datetime.fromisoformat(utc_text).replace(tzinfo=UTC)
    return when.astimezone().replace(tzinfo=None).isoformat()


def plain_jpeg(path: Path) -> Path:
    Image.new("RGB", (32, 24), (90, 120, 30)).save(path, "JPEG")  # no EXIF, XMP or IPTC at all
    return path


def exiftool_write(path: Path, *assignments: str) -> None:
    subprocess.run(["exiftool", "-q", "-overwrite_original", *assignments, str(path)], check=True)


def new_sidecar(path: Path, *assignments: str) -> None:
    subprocess.run(["exiftool", "-q", "-o", str(path), *assignments], check=True)


SINGLE_SOURCES = [
    ("EXIF DateTimeOriginal", ["-EXIF:DateTimeOriginal=2021:07:04 18:30:05", "-EXIF:SubSecTimeOriginal=047"],
     "2021-07-04T18:30:05", "047"),
    ("EXIF CreateDate", ["-EXIF:CreateDate=2021:07:04 18:30:06", "-EXIF:SubSecTimeDigitized=5"],
     "2021-07-04T18:30:06", "5"),
    ("XMP exif:DateTimeOriginal", ["-XMP-exif:DateTimeOriginal=2021:07:04 18:30:07.25+02:00"],
     "2021-07-04T18:30:07", "25"),
    ("XMP xmp:CreateDate", ["-XMP-xmp:CreateDate=2021:07:04 18:30:08"], "2021-07-04T18:30:08", None),
    ("XMP photoshop:DateCreated", ["-XMP-photoshop:DateCreated=2021:07:04 18:30:09"],
     "2021-07-04T18:30:09", None),
    ("IPTC DateCreated+TimeCreated", ["-IPTC:DateCreated=2021:07:04", "-IPTC:TimeCreated=18:30:10"],
     "2021-07-04T18:30:10", None),
    ("GPS date/time (UTC)", ["-GPS:GPSDateStamp=2021:07:04", "-GPS:GPSTimeStamp=16:30:11"],
     local("2021-07-04T16:30:11"), None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "tags", "taken", "subsec"), SINGLE_SOURCES, ids=[s[0] for s in SINGLE_SOURCES]
)
def test_capture_time_from_a_single_source(
    source: str, tags: list[str], taken: str, subsec: str | None, tmp_path: Path
) -> None:
    # Given a JPEG whose only date is this one source
    photo = plain_jpeg(tmp_path / "IMG_1.jpg")
    exiftool_write(photo, *tags)
    # When its capture time is read (as rename and archive read it)
    found = read_capture_time(photo)
    # Then it is that source's time, reported as taken from it, with its sub-seconds
    assert (found.taken, found.source, found.subsec) == (taken, source, subsec)
    assert taken_now(photo) == taken


def test_capture_time_from_the_photos_sidecar_only(tmp_path: Path) -> None:
    # Given a JPEG without a date and a Lightroom sidecar IMG_1.xmp that has xmp:CreateDate
    photo = plain_jpeg(tmp_path / "IMG_1.jpg")
    sidecar = tmp_path / "IMG_1.xmp"
    new_sidecar(sidecar, "-XMP-xmp:CreateDate=2020:01:02 03:04:05")
    # When its capture time is read
    found = read_capture_time(photo)
    # Then it comes from the sidecar
    assert (found.taken, found.source) == ("2020-01-02T03:04:05", "sidecar xmp:CreateDate")


def test_own_date_before_the_sidecar_but_a_raws_sidecar_before_the_raw(tmp_path: Path) -> None:
    # Given a JPEG with DateTimeOriginal and a sidecar that says otherwise, and a raw likewise
    photo = plain_jpeg(tmp_path / "IMG_1.jpg")
    exiftool_write(photo, "-EXIF:DateTimeOriginal=2021:07:04 18:30:05")
    new_sidecar(tmp_path / "IMG_1.jpg.xmp", "-XMP-exif:DateTimeOriginal=1999:01:01 00:00:00")
    raw = make_raw(tmp_path / "DSC_1.NEF", taken="2021:07:04 18:30:05")
    new_sidecar(tmp_path / "DSC_1.NEF.xmp", "-XMP-exif:DateTimeOriginal=2021:07:04 19:30:05")
    # Then the JPEG's own EXIF wins, and the raw's sidecar (where its shift went) wins
    assert read_capture_time(photo).source == "EXIF DateTimeOriginal"
    found = read_capture_time(raw)
    assert (found.taken, found.source) == ("2021-07-04T19:30:05", "sidecar exif:DateTimeOriginal")


def test_priority_when_every_source_is_there(tmp_path: Path) -> None:
    # Given a JPEG with CreateDate, XMP, IPTC and GPS dates but no DateTimeOriginal
    photo = plain_jpeg(tmp_path / "IMG_1.jpg")
    exiftool_write(
        photo, "-EXIF:CreateDate=2021:01:01 01:01:01", "-XMP-exif:DateTimeOriginal=2022:02:02 02:02:02",
        "-IPTC:DateCreated=2023:03:03", "-IPTC:TimeCreated=03:03:03",
        "-GPS:GPSDateStamp=2024:04:04", "-GPS:GPSTimeStamp=04:04:04",
    )  # fmt: skip
    # Then EXIF CreateDate is used; without it the XMP date; without that the IPTC pair
    assert read_capture_time(photo).source == "EXIF CreateDate"
    exiftool_write(photo, "-EXIF:CreateDate=")
    assert read_capture_time(photo).taken == "2022-02-02T02:02:02"
    exiftool_write(photo, "-XMP-exif:DateTimeOriginal=")
    assert read_capture_time(photo).source == "IPTC DateCreated+TimeCreated"


def test_quicktime_create_dates_from_exiftools_record() -> None:
    # Given exiftool's -G0:1 record of a HEIC with only QuickTime dates (12.57 cannot write them)
    utc_only = _keyed({"QuickTime:QuickTime:CreateDate": "2021:07:04 16:30:05"})
    with_zone = _keyed({"QuickTime:Keys:CreationDate": "2021:07:04 18:30:05+02:00", **utc_only})
    # Then Keys:CreationDate is the local time as written; QuickTime:CreateDate is UTC
    assert _pick(with_zone, _FILE_SOURCES).taken == "2021-07-04T18:30:05"
    utc = _pick(utc_only, _FILE_SOURCES)
    assert (utc.taken, utc.source) == (local("2021-07-04T16:30:05"), "QuickTime CreateDate (UTC)")
    assert _pick(_keyed({"QuickTime:QuickTime:CreateDate": "0000:00:00 00:00:00"}), _FILE_SOURCES) is None


def test_no_source_is_the_file_time_and_dates_without_a_time_are_not_capture_times(tmp_path: Path) -> None:
    photo = plain_jpeg(tmp_path / "IMG_1.jpg")
    exiftool_write(photo, "-XMP-photoshop:DateCreated=2021:07:04", "-IPTC:DateCreated=2021:07:04")
    found = read_capture_time(photo)
    assert (found.taken, found.source) == (None, FILE_TIME)


def test_sub_seconds_order_a_burst() -> None:
    shots = [("2021-07-04T18:30:05", "9"), ("2021-07-04T18:30:05", "047"), ("2021-07-04T18:30:05", "5")]
    assert sorted(shots, key=lambda s: order_key(*s)) == [shots[1], shots[2], shots[0]]
