"""A photographer's metadata (issue 21): keywords are added to, every clock moves with a shift and
no zone is invented, nothing is written where the file does not speak, the IPTC digest stays
current, and undecodable files are refused untouched (WebP: tests/unit/photos/test_modern_formats.py)."""

from __future__ import annotations

import hashlib
import io
import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from PIL import Image

from photojobs.testing import samples
from photos.errors import InvalidParameter, PhotoError, UnreadableImage
from photos.exif import ExifEdit, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from photos.params import lane_params, validate_params
from tests import clock_photos
from tests.fixtures import camera_corpus

if camera_corpus.heic_available():
    import pillow_heif

    pillow_heif.register_heif_opener()

SHIFTED = "2004:10:03 00:29:52"


def _tags(path: Path, *tags: str) -> dict[str, object]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", *tags, os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    record.pop("SourceFile", None)
    return record


def _warnings(path: Path) -> set[str]:
    out = ExifTool.shared().execute("-validate", "-warning", "-a", "-s3", os.path.abspath(path))
    return {line.strip() for line in out.splitlines()[1:] if line.strip()}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _listed(value: object) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


@pytest.fixture
def exiftool_in_zone(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    """The worker's exiftool running with TZ set to the test's parameter (restarted both ways)."""
    zone = request.param
    monkeypatch.setenv("TZ", zone)
    ExifTool.shared().close()  # the next command starts exiftool in this zone
    yield zone
    monkeypatch.undo()
    ExifTool.shared().close()


# -- keywords ------------------------------------------------------------------------------------
def test_keyword_parameters_are_checked_at_submission() -> None:
    # Given exif job parameters / When validated
    asked = {"exif.keywords": "a, Places|Ireland|Dublin", "exif.keywords_mode": "Replace"}
    out = validate_params(["exif"], asked)
    removing = validate_params(["exif"], {"exif.keywords_remove": "old,older"})
    # Then keywords are lists and the mode is normalised
    assert out == {"exif.keywords": ["a", "Places|Ireland|Dublin"], "exif.keywords_mode": "replace"}
    assert ExifEdit.from_params(lane_params(out, "exif")).keywords_mode == "replace"
    assert ExifEdit.from_params(lane_params(removing, "exif")).keywords_remove == ["old", "older"]
    # and a bad mode or an empty hierarchy level is refused naming the parameter
    with pytest.raises(InvalidParameter, match="exif.keywords_mode='merge'.*add or replace"):
        validate_params(["exif"], {"exif.keywords_mode": "merge"})
    with pytest.raises(InvalidParameter, match="empty level"):
        ExifEdit(keywords=["Places||Dublin"])
    with pytest.raises(InvalidParameter, match="keywords_remove has no meaning"):
        ExifEdit(keywords=["a"], keywords_remove=["b"], keywords_mode="replace")


def _tagged_camera_file(tmp_path: Path) -> Path:
    """A camera JPEG (with EXIF) whose keywords differ per place, as a real library's do."""
    src = clock_photos.camera_jpeg(tmp_path / "lumia.jpg", "pentax")
    ExifTool.shared().execute(
        "-overwrite_original",
        "-XMP-dc:Subject=2012",
        "-XMP-dc:Subject=dublin",
        "-IPTC:Keywords=2012",
        "-IPTC:Keywords=dublin",
        "-IPTC:Keywords=ireland",
        "-EXIF:XPKeywords=june;lumia;北京",
        os.path.abspath(src),
    )
    return src


def test_keywords_are_added_to_those_in_xmp_iptc_and_xpkeywords(tmp_path: Path) -> None:
    # Given a photo whose keywords are in XMP, IPTC and (in Chinese too) in XPKeywords
    src = _tagged_camera_file(tmp_path)
    dst = staged_path(src, "t1")
    # When keywords are written (one already there, one differing only in case, one new)
    write_metadata(src, dst, ExifEdit(keywords=["ireland", "Dublin", "new"]))
    # Then every place holds all of the photo's keywords in their order, then the new one, once each
    # whatever its case (the first spelling kept, as Lightroom does)
    expected = ["2012", "dublin", "ireland", "june", "lumia", "北京", "new"]
    tags = _tags(dst)
    assert _listed(tags["XMP-dc:Subject"]) == expected
    assert _listed(tags["IPTC:Keywords"]) == expected
    assert str(tags["IFD0:XPKeywords"]).split(";") == expected


def test_keywords_remove_and_replace_only_when_asked(tmp_path: Path) -> None:
    # Given a photo with keywords in XMP, IPTC and XPKeywords
    src = _tagged_camera_file(tmp_path)
    removed, replaced = staged_path(src, "t1"), staged_path(src, "t2")
    # When keywords are removed / Then only those go, everywhere
    write_metadata(src, removed, ExifEdit(keywords_remove=["2012", "lumia"]))
    tags = _tags(removed)
    assert _listed(tags["XMP-dc:Subject"]) == ["dublin", "ireland", "june", "北京"]
    assert _listed(tags["IPTC:Keywords"]) == ["dublin", "ireland", "june", "北京"]
    # When the mode is replace / Then the keywords are exactly the given ones
    write_metadata(src, replaced, ExifEdit(keywords=["only"], keywords_mode="replace"))
    tags = _tags(replaced)
    assert (tags["XMP-dc:Subject"], tags["IPTC:Keywords"], tags["IFD0:XPKeywords"]) == ("only",) * 3


def test_hierarchical_keywords_are_written_as_lightroom_reads_them(tmp_path: Path) -> None:
    # Given a photo with keywords
    src = _tagged_camera_file(tmp_path)
    dst, again = staged_path(src, "t1"), staged_path(src, "t2")
    # When a hierarchical keyword is added
    write_metadata(src, dst, ExifEdit(keywords=["Places|Ireland|Dublin"]))
    # Then the path is in lr:HierarchicalSubject and its leaf among the flat keywords everywhere,
    # once (the photo's own "dublin" is the same keyword)
    tags = _tags(dst)
    assert _listed(tags["XMP-lr:HierarchicalSubject"]) == ["Places|Ireland|Dublin"]
    for key in ("XMP-dc:Subject", "IPTC:Keywords"):
        assert [k.casefold() for k in _listed(tags[key])].count("dublin") == 1, key
    assert str(tags["IFD0:XPKeywords"]).casefold().split(";").count("dublin") == 1
    # When it is removed again / Then the path and its leaf are gone
    write_metadata(dst, again, ExifEdit(keywords_remove=["Places|Ireland|Dublin"]))
    tags = _tags(again)
    assert "XMP-lr:HierarchicalSubject" not in tags
    assert "dublin" not in [k.casefold() for k in _listed(tags["XMP-dc:Subject"])]


# -- clocks --------------------------------------------------------------------------------------
@pytest.mark.parametrize("exiftool_in_zone", ["UTC", "Europe/Berlin"], indirect=True)
@pytest.mark.parametrize("maker", sorted(clock_photos.MAKERS))
def test_a_shift_moves_every_clock_and_invents_no_zone(
    tmp_path: Path, maker: str, exiftool_in_zone: str
) -> None:
    # Given a camera file whose every clock (EXIF IFD0/ExifIFD/IFD1, maker note, XMP, IPTC) says
    # 2004-10-02 23:29:52, IPTC times without a zone and photoshop:DateCreated at +02:00, with an
    # EXIF zone offset, sub-seconds and a GPS time
    src = clock_photos.camera_jpeg(tmp_path / f"{maker}.jpg", maker)
    clock_photos.add_xmp_and_iptc(src)
    before = _tags(src, "-time:all", "--System:all", "--Composite:all")
    warned = _warnings(src)
    dst = staged_path(src, "t1")
    # When it is shifted by +1h on a worker whose zone is UTC or Europe/Berlin
    write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    # Then every clock moved across midnight, the date and time kept apart roll over together
    after = _tags(dst, "-time:all", "--System:all", "--Composite:all")
    expected = {
        "IFD0:ModifyDate": SHIFTED,
        "ExifIFD:DateTimeOriginal": SHIFTED,
        "ExifIFD:CreateDate": SHIFTED,
        "IFD1:ModifyDate": SHIFTED,
        "XMP-exif:DateTimeOriginal": SHIFTED,
        "XMP-xmp:CreateDate": SHIFTED,
        "XMP-xmp:ModifyDate": SHIFTED,
        "XMP-photoshop:DateCreated": SHIFTED + "+02:00",
        "IPTC:DateCreated": "2004:10:03",
        "IPTC:TimeCreated": "00:29:52",
        "IPTC:DigitalCreationDate": "2004:10:03",
        "IPTC:DigitalCreationTime": "00:29:52",
        # the zone offset, the sub-seconds and the GPS (UTC) time are no clocks to shift
        "ExifIFD:OffsetTimeOriginal": "+02:00",
        "ExifIFD:SubSecTimeOriginal": "123",
        "GPS:GPSDateStamp": "2004:10:02",
        "GPS:GPSTimeStamp": "21:29:52",
        **(
            {"Pentax:Date": "2004:10:03", "Pentax:Time": "00:29:52"}
            if maker == "pentax"
            else {"Nikon:PowerUpTime": SHIFTED}
        ),
    }
    assert after == expected, {k: (before.get(k), v) for k, v in after.items()}
    # and no time zone was added (none taken from the worker's machine), the digest is current
    assert _warnings(dst) <= warned, _warnings(dst) - warned


def test_a_shift_moves_a_png_clock_and_leaves_partial_dates_and_the_edit_history(tmp_path: Path) -> None:
    # Given a PNG with a tIME chunk, an XMP date of only a year and an XMP editing history
    src = tmp_path / "scan.png"
    samples._pattern((48, 32)).save(src, "PNG")
    ExifTool.shared().execute(
        "-overwrite_original",
        "-PNG:ModifyDate=2004:10:02 23:29:52",
        "-XMP-photoshop:DateCreated=2004",
        "-XMP-xmpMM:HistoryAction=saved",
        "-XMP-xmpMM:HistoryWhen=2004:10:02 23:00:00",
        os.path.abspath(src),
    )
    dst = staged_path(src, "t1")
    # When it is shifted by +1h
    write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    # Then the PNG clock moved; the year alone and the history of past saves stay as they were
    assert _tags(dst, "-time:all", "--System:all") == {
        "PNG:ModifyDate": SHIFTED,
        "XMP-photoshop:DateCreated": "2004",
        "XMP-xmpMM:HistoryWhen": "2004:10:02 23:00:00",
    }
    assert not {k.split(":")[0] for k in _tags(dst)} & {"IFD0", "ExifIFD"}


@pytest.mark.parametrize(
    "name",
    ["jpeg-everything", "jpeg-kodak", "tiff-everything", "png-everything"]
    + (["heic-everything"] if camera_corpus.heic_available() else []),
)
def test_a_full_edit_adds_no_validation_warning_to_camera_files(tmp_path: Path, name: str) -> None:
    # Given camera files with odd layouts (unterminated strings, EXIF tags in IFD0, a MakerNote)
    src = camera_corpus.make_corpus(tmp_path / "in")[name]
    dst = staged_path(src, "t1")
    # When every field is written and the time shifted
    edit = ExifEdit(
        keywords=["a", "Places|Ireland|Dublin"], description="d", rating=4, artist="a", copyright="c",
        shift=timedelta(hours=-2),
    )
    write_metadata(src, dst, edit)
    # Then exiftool -validate finds nothing the file did not already have
    assert _warnings(dst) <= _warnings(src), _warnings(dst) - _warnings(src)


def test_an_unshiftable_maker_note_date_refuses_the_file_untouched(tmp_path: Path) -> None:
    # Given a Pentax file whose maker-note date says month 13
    src = clock_photos.camera_jpeg(tmp_path / "pentax.jpg", "pentax")
    data = src.read_bytes()
    i = data.find(b"AOC\x00II")
    date_at = i + 6 + 2 + 8  # count, then the first entry's tag/type/count
    src.write_bytes(data[:date_at + 2] + b"\x0d" + data[date_at + 3 :])
    sha = _sha(src)
    dst = staged_path(src, "t1")
    # When it is shifted / Then it is refused naming the tag, nothing is written
    with pytest.raises(PhotoError, match="Pentax:Date"):
        write_metadata(src, dst, ExifEdit(shift=timedelta(hours=1)))
    assert not dst.exists() and _sha(src) == sha


# -- where the file speaks -----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"] + (["HEIF"] if camera_corpus.heic_available() else []))
def test_a_file_without_exif_gets_no_exif(tmp_path: Path, fmt: str) -> None:
    # Given a PNG (pHYs: 96 dpi), a JPEG (JFIF: 96 dpi) or a HEIC without any EXIF
    src = tmp_path / f"screen.{fmt.lower()}"
    samples._pattern((64, 48)).save(src, fmt, **({} if fmt == "HEIF" else {"dpi": (96, 96)}))
    dst = staged_path(src, "t1")
    # When every field is written
    edit = ExifEdit(keywords=["k"], description="d", rating=3, artist="a", copyright="c")
    write_metadata(src, dst, edit)
    # Then no EXIF structure exists, the resolution is still only the file's own 96 dpi
    tags = _tags(dst)
    assert not {k.split(":")[0] for k in tags} & {"IFD0", "ExifIFD", "IFD1"}, sorted(tags)
    with Image.open(dst) as img:
        assert not img.getexif()
        if fmt != "HEIF":
            assert round(img.info["dpi"][0]) == 96
    # and the values are in XMP (and IPTC in a JPEG)
    assert (tags["XMP-dc:Subject"], tags["XMP-xmp:Rating"]) == ("k", "3")
    assert ("IPTC:Keywords" in tags) == (fmt == "JPEG")
    assert _warnings(dst) <= _warnings(src)


def test_keywords_keep_the_iptc_digest_current(tmp_path: Path) -> None:
    # Given a file with IPTC and an IPTCDigest Photoshop wrote
    src = clock_photos.camera_jpeg(tmp_path / "digest.jpg", "pentax")
    clock_photos.add_xmp_and_iptc(src)
    assert "IPTCDigest is not current. XMP may be out of sync" not in _warnings(src)
    dst = staged_path(src, "t1")
    # When keywords and a caption are written
    write_metadata(src, dst, ExifEdit(keywords=["k"], description="caption"))
    # Then the digest matches the new block: exiftool -validate adds no warning
    tags = _tags(dst, "-Photoshop:IPTCDigest", "-File:CurrentIPTCDigest")
    assert tags["Photoshop:IPTCDigest"] == tags["File:CurrentIPTCDigest"]
    assert _warnings(dst) <= _warnings(src)


# -- refused files -------------------------------------------------------------------------------
def test_a_file_that_does_not_decode_is_refused_untouched(tmp_path: Path) -> None:
    # Given a JPEG with a sound structure and an EOI, but a Huffman table of garbage (exiftool is
    # happy with it: -validate says OK; Pillow cannot decode it)
    buf = io.BytesIO()
    samples._pattern((64, 48)).save(buf, "JPEG")
    data = bytearray(buf.getvalue())
    dht = data.find(b"\xff\xc4")
    length = int.from_bytes(data[dht + 2 : dht + 4], "big")
    data[dht + 5 : dht + 2 + length] = b"\xff" * (length - 3)
    src = tmp_path / "abîmé.jpg"
    src.write_bytes(bytes(data))
    sha = _sha(src)
    dst = staged_path(src, "t1")
    # When keywords are written / Then it is refused as undecodable, nothing is written
    with pytest.raises(UnreadableImage, match="does not decode"):
        write_metadata(src, dst, ExifEdit(keywords=["k"]))
    assert not dst.exists() and _sha(src) == sha
