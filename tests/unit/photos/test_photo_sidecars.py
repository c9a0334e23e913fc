"""Sidecars (issue 28): a raw's time shift moves every date its sidecar holds, and a JPEG's (any
photo's) sidecar -- ``NAME.xmp`` or ``NAME.EXT.xmp`` -- is found and gets the photo's edit, so the two
never disagree; a RAW+JPEG pair's ``NAME.xmp`` stays the raw's. Real exiftool on real files."""

from __future__ import annotations

import json
import subprocess
from datetime import timedelta
from pathlib import Path

from photojobs.testing import samples
from photos.exif import ExifEdit
from photos.sidecar import read_sidecar, sidecar_of, write_sidecar
from tests.raw_support import make_raw, preview_jpeg


def _xmp(path: Path, *tags: str) -> dict[str, object]:
    args = ["exiftool", "-j", "-G1", *tags, str(path)]
    out = subprocess.run(args, capture_output=True, check=True, text=True)
    return json.loads(out.stdout)[0]


def _sidecar(path: Path, *assignments: str) -> Path:
    subprocess.run(["exiftool", "-q", "-o", str(path), *assignments], check=True)
    return path


def test_a_raw_shift_moves_every_date_of_its_sidecar(tmp_path: Path) -> None:
    # Given a raw whose sidecar holds its capture time three ways, and when it was last edited
    raw = make_raw(tmp_path / "IMG_0007.NEF", preview=preview_jpeg())
    sidecar = _sidecar(
        tmp_path / "IMG_0007.NEF.xmp",
        "-XMP-exif:DateTimeOriginal=2021:07:04 18:30:05", "-XMP-xmp:CreateDate=2021:07:04 18:30:05",
        "-XMP-photoshop:DateCreated=2021:07:04 18:30:05+02:00", "-XMP-xmp:ModifyDate=2021:08:01 10:00:00",
    )  # fmt: skip
    # When its time is shifted by +6h
    target, content, _ = write_sidecar(raw, ExifEdit(shift=timedelta(hours=6)))
    assert target == sidecar and content is not None
    sidecar.write_bytes(content)
    # Then every date of the sidecar moved, each in its own form (the zone kept)
    tags = _xmp(sidecar, "-XMP:all")
    assert tags["XMP-exif:DateTimeOriginal"] == "2021:07:05 00:30:05"
    assert tags["XMP-xmp:CreateDate"] == "2021:07:05 00:30:05"
    assert tags["XMP-photoshop:DateCreated"] == "2021:07:05 00:30:05+02:00"
    assert tags["XMP-xmp:ModifyDate"] == "2021:08:01 16:00:00"


def test_a_jpeg_sidecar_of_either_name_gets_the_photos_edit(tmp_path: Path) -> None:
    # Given a JPEG with Lightroom's sidecar IMG_1.xmp (keywords and a capture time), and another
    # JPEG with darktable's IMG_2.jpg.xmp
    jpeg = tmp_path / "IMG_1.jpg"
    samples._pattern((64, 48)).save(jpeg, "JPEG")
    lightroom = _sidecar(
        tmp_path / "IMG_1.xmp", "-XMP-dc:Subject=family", "-XMP-exif:DateTimeOriginal=2021:07:04 18:30:05"
    )
    other = tmp_path / "IMG_2.jpg"
    samples._pattern((64, 48)).save(other, "JPEG")
    darktable = _sidecar(tmp_path / "IMG_2.jpg.xmp", "-XMP-dc:Subject=old")
    # When the sidecars are found and an edit planned
    assert sidecar_of(jpeg) == lightroom
    assert sidecar_of(other) == darktable
    edit = ExifEdit(keywords=["Family", "beach"], shift=timedelta(hours=1))
    target, content, before = write_sidecar(jpeg, edit)
    # Then Lightroom's sidecar is the one written: keywords merged (case-insensitively), time shifted
    assert target == lightroom and before == lightroom.read_bytes() and content is not None
    lightroom.write_bytes(content)
    meta = read_sidecar(lightroom)
    assert meta["keywords"] == ["family", "beach"] and meta["taken"] == "2021-07-04T19:30:05"
    # and a JPEG without a sidecar gets none
    lone = tmp_path / "IMG_3.jpg"
    samples._pattern((64, 48)).save(lone, "JPEG")
    assert write_sidecar(lone, ExifEdit(keywords=["x"]))[1] is None
    assert not (tmp_path / "IMG_3.jpg.xmp").exists() and not (tmp_path / "IMG_3.xmp").exists()


def test_a_raw_jpeg_pairs_stem_sidecar_is_the_raws(tmp_path: Path) -> None:
    # Given a RAW+JPEG pair with one Lightroom sidecar, and a lone JPEG with its own
    for name in ("IMG_5.CR2", "IMG_5.JPG", "IMG_5.xmp", "IMG_6.jpeg", "IMG_6.XMP"):
        (tmp_path / name).write_bytes(b"x")
    # When the sidecar each photo's edit goes to is asked
    # Then the pair's sidecar is the raw's alone, the lone JPEG's is its own
    assert sidecar_of(tmp_path / "IMG_5.CR2") == tmp_path / "IMG_5.xmp"
    assert sidecar_of(tmp_path / "IMG_5.JPG") is None
    assert sidecar_of(tmp_path / "IMG_6.jpeg") == tmp_path / "IMG_6.XMP"
