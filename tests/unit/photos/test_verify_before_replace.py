"""Verify before replace (issue 40): the copy exiftool wrote is checked against the original
(its image bytes, or its decoded pixels) before it may replace it; a JPEG XL with JPEG
reconstruction data (``jbrd``) is written without that box so that it still decodes; and a file
that does not decode is refused naming the file, never with a bare library exception."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest
from PIL import Image

from photos import exif as exif_module
from photos.errors import PhotoError, UnreadableImage
from photos.exif import JBRD_DROPPED, ExifEdit, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from photos.formats import check_decodes
from photos.verify import NotVerified, has_jbrd, jxl_codestream, pixel_digest, verify_written
from tests.fixtures import camera_corpus as cc
from tests.fixtures import metadata_files
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")

EDIT = ExifEdit(keywords=["Beach"], description="Low tide at the beach")


def test_a_jpeg_xl_with_reconstruction_data_is_written_without_it_and_decodes(tmp_path: Path) -> None:
    """Given a JPEG XL transcoded from a JPEG (a jbrd box) whose EXIF an edit makes longer
    When keywords and a description are written
    Then the copy has no jbrd box, the same codestream, decodes, and the result says why"""
    src = metadata_files.jxl_with_jbrd(tmp_path / "recompressed.jxl")
    original = src.read_bytes()
    assert has_jbrd(original)
    dst = staged_path(src, "t1")
    written = write_metadata(src, dst, EDIT)
    data = dst.read_bytes()
    assert not has_jbrd(data)
    assert jxl_codestream(data) == jxl_codestream(original)
    pixel_digest(dst)  # decodes
    assert JBRD_DROPPED in written.fixed
    assert src.read_bytes() == original


def test_a_written_copy_that_does_not_decode_is_refused_and_the_original_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the same JPEG XL, written as exiftool alone writes it (the jbrd box kept: libjxl then
    refuses the file with "Generic Error")
    When the edit is written
    Then verification refuses it naming the file; no copy is left and the original is untouched"""
    src = metadata_files.jxl_with_jbrd(tmp_path / "recompressed.jxl")
    original = src.read_bytes()
    monkeypatch.setattr(exif_module, "has_jbrd", lambda data: False)
    dst = staged_path(src, "t1")
    with pytest.raises(NotVerified) as caught:
        write_metadata(src, dst, EDIT)
    assert str(src) in str(caught.value) and "does not decode" in str(caught.value)
    assert not dst.exists()
    assert sorted(os.listdir(tmp_path)) == [src.name]
    assert src.read_bytes() == original


def test_a_photo_that_does_not_decode_is_refused_naming_the_file(tmp_path: Path) -> None:
    """Given a JPEG XL libjxl refuses (its jbrd box no longer matches its EXIF, as exiftool alone
    leaves it)
    When a writing lane checks it
    Then UnreadableImage names the file (no bare RuntimeError)"""
    src = metadata_files.jxl_with_jbrd(tmp_path / "recompressed.jxl")
    broken = tmp_path / "broken.jxl"
    ExifTool.shared().execute("-IFD0:ImageDescription=Low tide at the beach", "-o", str(broken), str(src))
    with pytest.raises(UnreadableImage) as caught:
        check_decodes(broken)
    assert str(broken) in str(caught.value) and "RuntimeError" in str(caught.value)


def _reencoded(src: Path, dst: Path, fmt: str, **options: object) -> None:
    with Image.open(src) as img:
        buf = io.BytesIO()
        changed = img.convert("RGB").point(lambda v: 255 - v)
        changed.save(buf, fmt, **options)
    dst.write_bytes(buf.getvalue())


@pytest.mark.parametrize(
    "fmt, suffix", [("JPEG", ".jpg"), ("PNG", ".png"), ("WEBP", ".webp"), ("TIFF", ".tif")]
)
def test_a_copy_whose_image_changed_is_refused(tmp_path: Path, fmt: str, suffix: str) -> None:
    """Given a photo and a copy of it whose pixels differ (same size, same format)
    When the copy is verified against the photo
    Then NotVerified names the photo and says what changed"""
    src = tmp_path / f"photo{suffix}"
    cc._pattern_image((64, 48), 6).save(src, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    copy = tmp_path / f"copy{suffix}"
    _reencoded(src, copy, fmt, **({"lossless": True} if fmt == "WEBP" else {}))
    with pytest.raises(NotVerified) as caught:
        verify_written(src, copy, fmt, src_data=src.read_bytes())
    assert str(src) in str(caught.value) and "changed" in str(caught.value)
    # and the photo itself verifies against an identical copy
    same = tmp_path / f"same{suffix}"
    same.write_bytes(src.read_bytes())
    verify_written(src, same, fmt, src_data=src.read_bytes())


def test_every_refusal_is_a_photo_error(tmp_path: Path) -> None:
    """Given a copy that cannot be read back
    When it is verified
    Then the refusal is a PhotoError naming the photo (an item error, never a crash)"""
    src = tmp_path / "photo.png"
    cc._pattern_image((8, 8), 1).save(src, "PNG")
    with pytest.raises(PhotoError) as caught:
        verify_written(src, tmp_path / "gone.png", "PNG", src_data=src.read_bytes())
    assert str(src) in str(caught.value)
