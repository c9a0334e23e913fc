"""Warnings exiftool handles are not refusals (issue 40): a stale ``IPTCDigest`` is written with IPTC
and XMP in sync and the digest renewed; the ``[minor]`` warnings exiftool recovers from (an empty
darktable XMP list, PNG text after the image data, a duplicate XMP property) are written and
recorded; a maker-notes warning still refuses; and a valid PNG with a large text chunk decodes."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from photos.exif import ExifEdit, read_metadata, write_metadata
from photos.exiftool import ExifTool
from photos.exiftool_messages import classify
from photos.fileops import staged_path
from photos.formats import check_decodes
from tests.fixtures import camera_corpus as cc
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")

EDIT = ExifEdit(keywords=["New"], description="Low tide")
XMP = """<?xpacket begin='\ufeff' id='W5M0MpCehiHzreSzNTczkc9d'?>
<x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">
<rdf:Description rdf:about="" xmlns:darktable="http://darktable.sf.net/"
 xmlns:dc="http://purl.org/dc/elements/1.1/" xmlns:xmp="http://ns.adobe.com/xap/1.0/"{attrs}>
{body}
</rdf:Description></rdf:RDF></x:xmpmeta>
<?xpacket end='w'?>"""


def _tags(path: Path, *tags: str) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", *tags, os.path.abspath(path))
    return json.loads(out, parse_int=str, parse_float=str)[0]


def _jpeg(path: Path) -> Path:
    cc._pattern_image((48, 32), 3).save(path, "JPEG", quality=90)
    return path


def _with_xmp(path: Path, body: str, attrs: str = "") -> Path:
    packet = path.with_suffix(".packet.xmp")
    packet.write_text(XMP.format(body=body, attrs=attrs), encoding="utf-8")
    ExifTool.shared().execute("-overwrite_original", f"-xmp<={packet}", os.path.abspath(path))
    packet.unlink()
    return path


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png_with(path: Path, chunk: bytes, *, after_idat: bool) -> Path:
    cc._pattern_image((200, 130), 4).save(path, "PNG")
    data = path.read_bytes()
    at = data.rfind(b"IEND") - 4 if after_idat else 33  # before IEND, or right after IHDR
    path.write_bytes(data[:at] + chunk + data[at:])
    return path


def test_a_stale_iptc_digest_is_written_in_sync_and_renewed(tmp_path: Path) -> None:
    """Given a JPEG whose IPTCDigest no longer matches its IPTC (another app touched it after Photoshop)
    When keywords and a description are written
    Then IPTC and XMP hold them, the digest is renewed (no warning left) and the result says so"""
    src = _jpeg(tmp_path / "touched.jpg")
    ExifTool.shared().execute(
        "-overwrite_original", "-IPTC:Keywords=Old", "-XMP-dc:Subject=Old", "-Photoshop:IPTCDigest=new",
        os.path.abspath(src),
    )  # fmt: skip
    ExifTool.shared().execute(
        "-overwrite_original", "-Photoshop:IPTCDigest=0123456789abcdef0123456789abcdef", os.path.abspath(src)
    )
    assert "IPTCDigest is not current" in _tags(src, "-Warning").get("ExifTool:Warning", "")
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, EDIT)
    after = _tags(dst, "-IPTC:Keywords", "-XMP-dc:Subject", "-IPTC:Caption-Abstract", "-XMP-dc:Description",
                  "-Warning")  # fmt: skip
    assert after["IPTC:Keywords"] == after["XMP-dc:Subject"] == ["Old", "New"]
    assert after["IPTC:Caption-Abstract"] == after["XMP-dc:Description"] == "Low tide"
    assert "ExifTool:Warning" not in after
    assert any("IPTCDigest" in f for f in written.result()["exiftool_fixed"])


@pytest.mark.parametrize(
    "case, body, attrs, said",
    [
        ("darktable", "<darktable:history><rdf:Seq/></darktable:history>", "", "Ignored empty rdf:Seq list"),
        ("duplicate", "<xmp:Rating>3</xmp:Rating>", ' xmp:Rating="2"', "Duplicate XMP property"),
    ],
)
def test_a_minor_xmp_warning_is_written_and_recorded(
    tmp_path: Path, case: str, body: str, attrs: str, said: str
) -> None:
    """Given a JPEG whose XMP exiftool reads with a [minor] warning it recovers from
    When keywords are written
    Then the photo is written (not refused) and the result names the warning"""
    src = _with_xmp(_jpeg(tmp_path / f"{case}.jpg"), body, attrs)
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, EDIT)
    assert read_metadata(dst)["keywords"] == ["New"]
    assert any(said in w for w in written.result()["exiftool_warned"])


def test_png_text_after_the_image_data_is_written_and_recorded(tmp_path: Path) -> None:
    """Given a PNG with a text chunk after its IDAT
    When keywords are written
    Then it is written (exiftool moves the text; the pixels verified unchanged) and the result says so"""
    src = _png_with(
        tmp_path / "late.png", _png_chunk(b"tEXt", b"Comment\x00after the pixels"), after_idat=True
    )
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, EDIT)
    assert read_metadata(dst)["keywords"] == ["New"]
    assert any("after PNG IDAT" in w for w in written.result()["exiftool_warned"])


def test_a_valid_png_with_a_large_text_chunk_decodes_and_is_written(tmp_path: Path) -> None:
    """Given a valid 200x130 PNG with a zTXt chunk of 4 MB of text (over Pillow's 1 MB text limit)
    When it is checked and keywords are written
    Then it decodes (Pillow's text limits raised for metadata only) and is written"""
    text = zlib.compress(b"x" * (4 * 1024 * 1024))
    src = _png_with(tmp_path / "notes.png", _png_chunk(b"zTXt", b"Comment\x00\x00" + text), after_idat=False)
    check_decodes(src)
    dst = staged_path(src, "t1")
    write_metadata(src, dst, EDIT)
    assert read_metadata(dst)["keywords"] == ["New"]


def test_a_maker_notes_warning_still_refuses() -> None:
    """Given exiftool's minor warnings / When classified
    Then the ones about maker notes refuse, the others are recorded"""
    said = classify(["Warning: [minor] Maker notes could not be parsed - /p/a.jpg",
                     "Warning: [minor] IPTC Category too long (7 bytes; should be 3 max) - /p/a.jpg"],
                    "/p/a.jpg")  # fmt: skip
    assert said.refusal() == "[minor] Maker notes could not be parsed"
    assert said.recovered == ["[minor] IPTC Category too long (7 bytes; should be 3 max)"]
