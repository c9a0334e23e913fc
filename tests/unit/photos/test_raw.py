"""Camera raws: every raw extension is a photo, a folder scan says what it left out, a raw is
analysed from its metadata and preview (or LibRaw), and its metadata goes to an XMP sidecar that
merges with the one already there; the raw itself is never written."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest

from photojobs.api import Client, scan_photos
from photojobs.config import Settings
from photos.analyze import analyze
from photos.errors import UnreadableImage
from photos.exif import ExifEdit
from photos.fileops import sha256_file
from photos.raw import RAW_SUFFIXES, is_raw
from photos.rename import taken_now
from photos.sidecar import companion_target, companions, new_sidecar, read_sidecar, write_sidecar
from tests.raw_support import make_raw, preview_jpeg

COMMON_RAWS = (
    "CR2 CR3 CRW NEF NRW ARW SR2 SRF DNG ORF RW2 RAF PEF SRW X3F IIQ 3FR MRW ERF KDC DCR MOS MEF RWL"
).split()


def exiftool_json(path: Path, *tags: str) -> dict[str, object]:
    out = subprocess.run(
        ["exiftool", "-j", "-G1", *tags, str(path)], capture_output=True, check=True, text=True
    )
    return json.loads(out.stdout)[0]


@pytest.mark.parametrize("ext", COMMON_RAWS)
def test_every_common_raw_extension_is_a_photo_in_any_case(ext: str, tmp_path: Path) -> None:
    # Given a folder with a raw of this extension in upper and lower case
    for name in (f"A.{ext}", f"b.{ext.lower()}"):
        (tmp_path / name).write_bytes(b"raw bytes")
    # When the folder is scanned
    scan = scan_photos([tmp_path])
    # Then both are photos of the job, and nothing was left out
    assert is_raw(f"x.{ext}") and f".{ext.lower()}" in RAW_SUFFIXES
    assert [p.name for p in scan.photos] == [f"A.{ext}", f"b.{ext.lower()}"]
    assert scan.skipped == {}


def test_folder_scan_reports_what_it_left_out_and_why(tmp_path: Path) -> None:
    folder = tmp_path / "photos"
    folder.mkdir()
    # Given a folder of 3 raws, a JPEG, sidecars, notes, a hidden file, a hidden folder and a stray temp
    for name in ("IMG_1.NEF", "IMG_2.rw2", "IMG_3.CR3", "IMG_4.jpg", "notes.txt", "list.csv", "IMG_9.psd"):
        (folder / name).write_bytes(b"x")
    (folder / "IMG_1.NEF.xmp").write_text("<x/>")  # darktable / digiKam
    (folder / "IMG_2.xmp").write_text("<x/>")  # Lightroom
    (folder / "IMG_4.jpg.xmp").write_text("<x/>")  # darktable's for a JPEG
    (folder / "gone.CR2.xmp").write_text("<x/>")  # its raw was deleted
    (folder / ".DS_Store").write_bytes(b"x")
    (folder / ".IMG_4.jpg.pj-i3-t1.tmp").write_bytes(b"x")
    (folder / ".thumbs").mkdir()
    (folder / ".thumbs" / "t.jpg").write_bytes(b"x")
    # When it is scanned, and planned as a job
    scan = scan_photos([folder])
    plan = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'db'}"})).plan(
        ["analysis"], [folder]
    )
    # Then the raws are photos, and every file left out is counted under its reason
    assert [p.name for p in scan.photos] == ["IMG_1.NEF", "IMG_2.rw2", "IMG_3.CR3", "IMG_4.jpg"]
    expected = {
        "hidden file": 1,
        "hidden folder": 1,
        "not a photo": 3,
        "photojobs temp file": 1,
        "sidecar of a photo": 1,
        "sidecar of a raw": 2,
        "sidecar without its photo": 1,
    }
    assert scan.skipped == expected
    assert plan.skipped == expected and len(plan.photos) == 4


def test_analysis_of_a_raw_reads_the_camera_facts_and_its_embedded_preview(tmp_path: Path) -> None:
    # Given a NEF LibRaw cannot decode that carries the camera's facts and a JPEG preview
    raw = make_raw(tmp_path / "DSC_0001.NEF", preview=preview_jpeg((320, 240)), size=(64, 48))
    before, mtime = sha256_file(raw), raw.stat().st_mtime_ns
    # When it is analysed
    facts = analyze(raw)
    # Then the facts come from its metadata and the pixel measures from the preview; the raw is untouched
    assert facts["format"] == "NEF" and facts["raw"] is True
    assert (facts["make"], facts["model"]) == ("NIKON CORPORATION", "NIKON D750")
    assert facts["taken"] == "2021-07-04T18:30:05"
    assert facts["gps"] == pytest.approx({"lat": 48.8584, "lon": 2.2945}, abs=1e-4)
    assert (facts["width"], facts["height"]) == (64, 48)  # the sensor image, not the preview's
    assert facts["pixels_from"] == "ThumbnailImage"
    assert facts["colors"][0] == "#c8501e"  # the preview's colour
    assert facts["sha256"] == before and len(facts["phash"]) == 16
    assert (sha256_file(raw), raw.stat().st_mtime_ns) == (before, mtime)


def test_analysis_of_a_dng_without_preview_decodes_it_with_libraw(tmp_path: Path) -> None:
    # Given a DNG with a Bayer sensor image and no embedded preview
    raw = make_raw(tmp_path / "IMG_0002.dng", dng=True, size=(64, 48))
    # When it is analysed
    facts = analyze(raw)
    # Then LibRaw demosaiced it (the picture has the bright block: not flat) and the facts are read
    assert facts["pixels_from"] == "libraw"
    assert facts["format"] == "DNG" and facts["taken"] == "2021-07-04T18:30:05"
    assert facts["sharpness"] > 0 and len(facts["colors"]) >= 2


def test_a_raw_that_neither_decodes_nor_has_a_preview_fails_clearly_and_is_untouched(tmp_path: Path) -> None:
    # Given a .NEF that is garbage
    raw = tmp_path / "broken.NEF"
    raw.write_bytes(b"\x00\x01 not a raw at all " * 64)
    before = sha256_file(raw)
    # When it is analysed
    with pytest.raises(UnreadableImage) as caught:
        analyze(raw)
    # Then the reason says it has no preview and LibRaw cannot decode it, and the file is as it was
    assert "no usable embedded preview" in str(caught.value) and "LibRaw" in str(caught.value)
    assert str(raw) in str(caught.value)
    assert sha256_file(raw) == before


def test_a_raw_gets_a_new_sidecar_named_after_the_whole_raw_name(tmp_path: Path) -> None:
    # Given a raw without a sidecar
    raw = make_raw(tmp_path / "IMG_0001.CR2", preview=preview_jpeg())
    # When an edit is planned for it
    target, content, before = write_sidecar(
        raw, ExifEdit(keywords=["Places|Ireland|Dublin", "trip"], rating=4, description="Liffey")
    )
    # Then it goes to IMG_0001.CR2.xmp, a new file whose tags exiftool and photo apps read
    assert target == tmp_path / "IMG_0001.CR2.xmp" == new_sidecar(raw) and before is None
    assert content is not None
    target.write_bytes(content)
    meta = read_sidecar(target)
    assert meta["keywords"] == ["Dublin", "trip"] and meta["rating"] == 4 and meta["description"] == "Liffey"
    assert (
        exiftool_json(target, "-XMP-lr:HierarchicalSubject")["XMP-lr:HierarchicalSubject"]
        == "Places|Ireland|Dublin"
    )


def test_an_existing_lightroom_sidecar_is_merged_never_replaced(tmp_path: Path) -> None:
    # Given a raw with a Lightroom sidecar IMG_0003.xmp holding keywords, a headline and develop settings
    raw = make_raw(tmp_path / "IMG_0003.ARW", preview=preview_jpeg())
    sidecar = tmp_path / "IMG_0003.xmp"
    subprocess.run(
        ["exiftool", "-q", "-o", str(sidecar), "-XMP-dc:Subject=family", "-XMP-dc:Subject=beach",
         "-XMP-photoshop:Headline=Summer", "-XMP-crs:Exposure2012=+0.35"],
        check=True,
    )  # fmt: skip
    # When keywords and a rating are written
    target, content, before = write_sidecar(raw, ExifEdit(keywords=["beach", "sunset"], rating=5))
    # Then the Lightroom sidecar is the one updated: its keywords kept (no duplicate), the rest as it was
    assert target == sidecar and before == sidecar.read_bytes() and content is not None
    sidecar.write_bytes(content)
    assert read_sidecar(sidecar)["keywords"] == ["family", "beach", "sunset"]
    tags = exiftool_json(sidecar, "-XMP-photoshop:Headline", "-XMP-crs:Exposure2012", "-XMP-xmp:Rating")
    assert tags["XMP-photoshop:Headline"] == "Summer" and tags["XMP-xmp:Rating"] == 5
    assert float(str(tags["XMP-crs:Exposure2012"])) == pytest.approx(0.35)
    assert not (tmp_path / "IMG_0003.ARW.xmp").exists()


def test_an_empty_edit_creates_no_sidecar(tmp_path: Path) -> None:
    # Given a raw without a sidecar
    raw = make_raw(tmp_path / "IMG_0004.PEF", preview=preview_jpeg())
    # When an edit that changes nothing is planned
    _, content, before = write_sidecar(raw, ExifEdit())
    # Then there is nothing to write
    assert content is None and before is None


def test_a_shift_goes_to_the_sidecar_and_the_raw_reads_its_shifted_time(tmp_path: Path) -> None:
    # Given a raw taken 2021-07-04 18:30:05
    raw = make_raw(tmp_path / "IMG_0005.NEF", preview=preview_jpeg())
    # When its time is shifted by +6h (the sidecar written)
    target, content, _ = write_sidecar(raw, ExifEdit(shift=timedelta(hours=6)))
    assert content is not None
    target.write_bytes(content)
    # Then the sidecar carries the shifted time and the raw's time, as apps read it, is the shifted one
    assert (
        exiftool_json(target, "-XMP-exif:DateTimeOriginal")["XMP-exif:DateTimeOriginal"]
        == "2021:07:05 00:30:05"
    )
    assert taken_now(raw) == "2021-07-05T00:30:05"
    # and a second shift starts from the sidecar's time
    target2, content2, _ = write_sidecar(raw, ExifEdit(shift=timedelta(hours=-1)))
    assert target2 == target and content2 is not None
    target.write_bytes(content2)
    assert taken_now(raw) == "2021-07-04T23:30:05"


def test_sidecars_travel_with_the_new_name_of_their_raw(tmp_path: Path) -> None:
    # Given a raw with both sidecar conventions (any case) and a JPEG with darktable's
    raw = tmp_path / "IMG_0001.CR2"
    for name in ("IMG_0001.CR2", "IMG_0001.cr2.XMP", "IMG_0001.xmp", "IMG_0001.JPG", "IMG_0001.JPG.xmp"):
        (tmp_path / name).write_bytes(b"x")
    # When their companions and new names are asked
    found = companions(raw)
    new = tmp_path / "2021" / "20210704_183005.cr2"
    # Then the raw owns both, each renamed after the raw's new name; the JPEG owns only its own
    assert [p.name for p in found] == ["IMG_0001.cr2.XMP", "IMG_0001.xmp"]
    assert [companion_target(c, raw, new).name for c in found] == [
        "20210704_183005.cr2.XMP",
        "20210704_183005.xmp",
    ]
    assert [p.name for p in companions(tmp_path / "IMG_0001.JPG")] == ["IMG_0001.JPG.xmp"]


def test_the_fixture_raws_are_real_raws(tmp_path: Path) -> None:
    # Given the test raws
    nef = make_raw(tmp_path / "a.NEF", preview=preview_jpeg())
    dng = make_raw(tmp_path / "b.DNG", dng=True)
    # When exiftool reads them
    # Then they are what they claim: a NEF with a preview, a DNG with a CFA sensor image
    assert exiftool_json(nef, "-FileType")["File:FileType"] == "NEF"
    assert exiftool_json(dng, "-FileType", "-DNGVersion")["File:FileType"] == "DNG"
    assert os.path.getsize(dng) > 64 * 48 * 2
