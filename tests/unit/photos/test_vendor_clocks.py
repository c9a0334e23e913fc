"""Every clock exiftool can shift, shifted (issue 28): a vendor clock exiftool cannot write (a Samsung
phone HEIC's ``Samsung:TimeStamp``) is left as it is and reported, never a reason to refuse the
photo; an EXIF date in ISO 8601 form and a Kodak maker note's date split over three tags move with
the others. Real exiftool on files built from the project's fixtures."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from photos.exif import ExifEdit, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from tests.fixtures import camera_corpus, metadata_files
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")


def _clocks(path: Path) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", "-time:all", os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    return {k: v for k, v in record.items() if not k.startswith(("System:", "SourceFile"))}


@pytest.mark.skipif(
    not camera_corpus.heic_available() and not IN_CI, reason="pillow-heif cannot encode HEIC here"
)
def test_a_samsung_heic_is_shifted_leaving_the_clock_exiftool_cannot_write(tmp_path: Path) -> None:
    # Given a Samsung phone HEIC: EXIF clocks, and the trailer's TimeStamp exiftool reads but cannot write
    src = metadata_files.samsung_heic(tmp_path / "20230927_143533.heic")
    before = _clocks(src)
    assert before["Samsung:TimeStamp"] == "2023:09:30 10:35:33.000+00:00"
    dst = staged_path(src, "t1")
    # When the photo is shifted by an hour
    written = write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    # Then every EXIF clock moved, the Samsung clock is as it was and named in the result
    after = _clocks(dst)
    for key in ("IFD0:ModifyDate", "ExifIFD:DateTimeOriginal"):
        assert after[key] == "2023:09:27 15:35:33", key
    assert after["Samsung:TimeStamp"] == before["Samsung:TimeStamp"]
    assert written.result() == {"unshifted": ["Samsung:TimeStamp"]}


def test_an_iso_formatted_exif_date_is_shifted_in_its_own_form(tmp_path: Path) -> None:
    # Given a JPEG whose ModifyDate an app wrote as ISO 8601 with a zone
    src = metadata_files.iso_date_jpeg(tmp_path / "iso.jpg")
    assert _clocks(src)["IFD0:ModifyDate"] == "2023-09-27T14:35:33+02:00"
    dst = staged_path(src, "t1")
    # When it is shifted past midnight
    write_metadata(src, dst, ExifEdit(shift=timedelta(hours=10)))
    # Then both dates moved, the ISO one keeping its form and zone
    after = _clocks(dst)
    assert after["IFD0:ModifyDate"] == "2023-09-28T00:35:33+02:00"
    assert after["ExifIFD:DateTimeOriginal"] == "2023:09:28 00:35:33"


def test_a_kodak_date_split_over_three_maker_note_tags_rolls_over_with_the_others(tmp_path: Path) -> None:
    # Given a Kodak JPEG taken on New Year's Eve, its maker note's date in YearCreated/MonthDayCreated/
    # TimeCreated
    src = metadata_files.kodak_jpeg(tmp_path / "kodak.jpg")
    before = _clocks(src)
    assert (before["Kodak:YearCreated"], before["Kodak:MonthDayCreated"]) == ("2005", "12:31")
    dst = staged_path(src, "t1")
    # When it is shifted by an hour
    write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    # Then the maker note's date rolls into the new year with the EXIF clocks (hundredths kept)
    after = _clocks(dst)
    assert after["ExifIFD:DateTimeOriginal"] == "2006:01:01 00:47:23"
    assert (after["Kodak:YearCreated"], after["Kodak:MonthDayCreated"], after["Kodak:TimeCreated"]) == (
        "2006", "01:01", "00:47:23.05"
    )
