"""Write what exiftool writes (issue 28): exiftool's messages are classified one way on read and write
(a ``[minor]`` warning saying exiftool fixed something is recorded, not a refusal; any other warning
refuses), and a legacy IPTC block without ``CodedCharacterSet`` (Picasa) is converted from its real
charset instead of refused. Files built with exiftool from the project's fixtures; each edit is
checked to change only the asked tags."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from photos.exif import ExifEdit, read_metadata, write_metadata
from photos.exiftool import ExifTool
from photos.exiftool_messages import classify
from photos.fileops import staged_path
from tests.fixtures import metadata_files
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")

# what exiftool derives, or what describes the file rather than its metadata
DERIVED = ("Composite:", "System:", "File:", "ExifTool:")
# the fixed records exiftool adds when it creates (or converts) an IPTC block
IPTC_STRUCTURE = {"IPTC:EnvelopeRecordVersion", "IPTC:ApplicationRecordVersion", "IPTC:CodedCharacterSet"}


def _dump(path: Path, *options: str) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", "-u", "-b", *options, os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    return {k: v for k, v in record.items() if k != "SourceFile" and not k.startswith(DERIVED)}


def _changed(before: dict[str, Any], after: dict[str, Any]) -> set[str]:
    return {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}


def test_minor_warnings_are_classified_by_whether_exiftool_fixed_them() -> None:
    # Given exiftool's warnings as it prints them / When classified
    said = classify(
        [
            "Warning: [minor] Fixed incorrect URI for xmlns:MicrosoftPhoto - /p/a.jpg",
            "Warning: [minor] Maker notes could not be parsed - /p/a.jpg",
            "Warning: Sorry, Samsung:TimeStamp doesn't exist or isn't writable",
            "Warning: Bad IFD0 directory - /p/a.jpg",
        ],
        "/p/a.jpg",
    )
    # Then a fix is recorded, a tag exiftool cannot write is named, the rest refuses
    assert said.fixed == ["[minor] Fixed incorrect URI for xmlns:MicrosoftPhoto"]
    assert said.unwritable == ["Samsung:TimeStamp"]
    assert said.refusal(allowed_unwritable={"Samsung:TimeStamp"}) == (
        "Bad IFD0 directory; [minor] Maker notes could not be parsed"
    )


def test_a_photo_windows_touched_is_edited_and_the_fix_recorded(tmp_path: Path) -> None:
    # Given a JPEG whose XMP Windows wrote under the wrong MicrosoftPhoto URI
    src = metadata_files.windows_jpeg(tmp_path / "windows.jpg")
    warned = ExifTool.shared().execute("-s3", "-warning", os.path.abspath(src))
    assert warned.strip() == "[minor] Fixed incorrect URI for xmlns:MicrosoftPhoto"
    before = _dump(src)
    dst = staged_path(src, "t1")
    # When keywords and a description are written
    written = write_metadata(src, dst, ExifEdit(keywords=["Sea"], description="Low tide"))
    # Then the file is written, the fix exiftool made is reported in the result
    assert written.result() == {"exiftool_fixed": ["[minor] Fixed incorrect URI for xmlns:MicrosoftPhoto"]}
    meta = read_metadata(dst)
    assert (meta["keywords"], meta["description"]) == (["Beach", "Family", "Sea"], "Low tide")
    # and only the asked tags changed (Windows' own rating and keyword list kept)
    after = _dump(dst)
    allowed = {"XMP-dc:Subject", "XMP-dc:Description", "IPTC:Keywords", "IPTC:Caption-Abstract",
               "IFD0:XPKeywords", "IFD0:ImageDescription", *IPTC_STRUCTURE}  # fmt: skip
    assert _changed(before, after) <= allowed
    assert after["XMP-microsoft:RatingPercent"] == before["XMP-microsoft:RatingPercent"] == "75"
    assert after["XMP-microsoft:LastKeywordXMP"] == ["Beach", "Family"]


@pytest.mark.parametrize("encoding", ["utf-8", "cp1252"])
def test_a_legacy_iptc_block_is_converted_from_its_real_charset(tmp_path: Path, encoding: str) -> None:
    # Given a JPEG whose IPTC declares no charset: Picasa's UTF-8 bytes, or an old tool's Latin ones
    src = metadata_files.legacy_iptc_jpeg(tmp_path / f"picasa {encoding}.jpg", encoding)
    before = _dump(src)
    dst, all_three = staged_path(src, "t1"), staged_path(src, "t2")
    # When keywords and the artist are written
    write_metadata(src, dst, ExifEdit(keywords=["Noël"], artist="Ann"))
    # Then the block is UTF-8 and says so, every value with its real text (no "CafÃ©")
    after = _dump(dst)
    assert after["IPTC:CodedCharacterSet"] == "UTF8"
    assert after["IPTC:Keywords"] == ["Café", "Family", "Noël"]
    assert after["IPTC:By-line"] == "Ann"
    assert after["IPTC:Caption-Abstract"] == "Fête à Noël"
    assert read_metadata(dst)["keywords"] == ["Café", "Family", "Noël"]
    # and nothing else changed but the asked tags (in XMP and EXIF too) and the IPTC structure
    allowed = {"IPTC:Keywords", "IPTC:By-line", "XMP-dc:Subject", "XMP-dc:Creator", "IFD0:XPKeywords",
               "IFD0:Artist", "IPTC:Caption-Abstract", *IPTC_STRUCTURE}  # fmt: skip
    assert _changed(before, after) <= allowed
    # When every value the block has is replaced (nothing is left to copy)
    write_metadata(src, all_three, ExifEdit(keywords=["New"], artist="Ann", description="Plage"))
    # Then it is written all the same ("No writable tags set" is no refusal)
    after = _dump(all_three)
    assert (after["IPTC:Keywords"], after["IPTC:Caption-Abstract"]) == (["Café", "Family", "New"], "Plage")
    # When every keyword is removed while another value is set / Then none is copied back
    cleared = staged_path(src, "t3")
    write_metadata(src, cleared, ExifEdit(keywords_remove=["café", "family"], artist="Ann"))
    after = _dump(cleared)
    assert "IPTC:Keywords" not in after and after["IPTC:Caption-Abstract"] == "Fête à Noël"
