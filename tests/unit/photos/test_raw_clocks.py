"""Raw clocks of every maker (issue 40): a raw that keeps its capture time outside EXIF (Canon
CRW's ``CanonRaw:DateTimeOriginal``; the table in ``photos/raw_clocks.py``) is dated by it for
analysis and rename, and a shift moves it into the raw's sidecar (the raw is never written)."""

from __future__ import annotations

import datetime
from datetime import timedelta
from pathlib import Path

import pytest

from photos.analyze import analyze
from photos.capture_time import read_capture_time
from photos.exif import ExifEdit
from photos.exiftool import ExifTool
from photos.fileops import sha256_file
from photos.raw_clocks import RAW_CLOCKS
from photos.rename import render, taken_now
from photos.sidecar import write_sidecar
from tests.raw_support import make_crw
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")

SHOT = datetime.datetime(2005, 4, 23, 10, 11, 12)


def test_a_crw_is_dated_by_its_canonraw_clock_for_analysis_and_rename(tmp_path: Path) -> None:
    """Given a Canon CRW shot 2005-04-23 10:11:12 (its clock only in CanonRaw:DateTimeOriginal)
    When it is analysed and a rename pattern rendered from the facts
    Then both use that clock, not the file time"""
    crw = make_crw(tmp_path / "CRW_0001.CRW", SHOT)
    found = read_capture_time(crw)
    assert (found.taken, found.source) == ("2005-04-23T10:11:12", "Canon CRW CanonRaw:DateTimeOriginal")
    facts = analyze(crw)
    assert (facts["taken"], facts["taken_from"]) == ("2005-04-23T10:11:12", found.source)
    assert facts["pixels_from"] == "JpgFromRaw"
    name = render("{taken:%Y-%m-%d_%H%M%S}", facts, crw, crw.stat().st_mtime)
    assert str(name.relpath).startswith("2005-04-23_101112")


def test_a_shift_of_a_crw_moves_its_clock_into_the_sidecar(tmp_path: Path) -> None:
    """Given the CRW without a sidecar
    When its time is shifted by +1h
    Then its new sidecar holds the shifted CanonRaw clock, the raw reads it, and the raw is unchanged"""
    crw = make_crw(tmp_path / "CRW_0002.CRW", SHOT)
    before = sha256_file(crw)
    target, content, _ = write_sidecar(crw, ExifEdit(shift=timedelta(hours=1)))
    assert content is not None
    target.write_bytes(content)
    assert taken_now(crw) == "2005-04-23T11:11:12"
    assert sha256_file(crw) == before


def test_every_raw_clock_is_one_exiftool_reads(tmp_path: Path) -> None:
    """Given the table of raw clocks kept outside EXIF
    When exiftool lists the tags it knows
    Then every tag named is one of them (a misspelt group reads nothing, silently)"""
    known = ExifTool.shared().execute("-listg1")
    groups = set(known.split())
    for raw, key in RAW_CLOCKS:
        assert key.split(":")[0] in groups, (raw, key)
