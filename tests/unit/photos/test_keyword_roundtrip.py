"""Keywords round-trip clean (issue 28): a later job never reads a store's lossy copy (IPTC's 64-byte
cut, XPKeywords' UCS-2) back as a keyword of its own, keywords compare case-insensitively, a removal
removes from every store that lists keywords, and N jobs leave exactly what one job would. Real
exiftool on camera JPEGs of the project's corpus."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from photos.exif import ExifEdit, read_metadata, write_metadata
from photos.exiftool import ExifTool
from photos.fileops import staged_path
from tests.fixtures import camera_corpus
from tests.support import IN_CI

pytestmark = pytest.mark.skipif(not ExifTool().available() and not IN_CI, reason="exiftool is not installed")

#: 70 characters, 75 bytes in UTF-8: IPTC keeps only its first 64 bytes.
LONG = "Sonnenuntergang am Strand von Saint-Malo, Bretagne, été 2023 – Nº 7 ok"
EMOJI = "🏖️"  # U+1F3D6 U+FE0F: beyond UCS-2, so XPKeywords mangles it
STORES = (
    "-XMP-dc:Subject",
    "-XMP-lr:HierarchicalSubject",
    "-IPTC:Keywords",
    "-EXIF:XPKeywords",
    "-XMP-microsoft:LastKeywordXMP",
    "-XMP-mediapro:CatalogSets",
)


def _stores(path: Path) -> dict[str, Any]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", *STORES, os.path.abspath(path))
    record = json.loads(out, parse_int=str, parse_float=str)[0]
    record.pop("SourceFile", None)
    return record


def _listed(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _camera_jpeg(folder: Path, name: str) -> Path:
    """A camera JPEG with an EXIF block (so XPKeywords is written too)."""
    path = folder / name
    path.write_bytes(camera_corpus._jpeg_with_exif(camera_corpus.exif_layout("interop"), (64, 48), 1))
    return path


def _jobs(src: Path, edits: list[ExifEdit]) -> Path:
    """``src`` edited by one job after the other (each reading the previous job's result)."""
    current = src
    for n, edit in enumerate(edits):
        out = staged_path(src, f"job{n}")
        write_metadata(current, out, edit)
        current = out
    return current


def test_three_keyword_jobs_leave_exactly_what_one_job_would(tmp_path: Path) -> None:
    # Given two copies of a camera photo (EXIF, so keywords go to XMP, IPTC and XPKeywords)
    assert len(LONG) == 70 and len(LONG.encode()) > 64
    three, one = _camera_jpeg(tmp_path, "three.jpg"), _camera_jpeg(tmp_path, "one.jpg")
    # When three jobs run on one: add a 70-character keyword, an emoji and a non-ASCII keyword; add
    # "Second"; remove the non-ASCII one
    after_three = _jobs(
        three,
        [ExifEdit(keywords=[LONG, EMOJI, "Ærøskøbing"]), ExifEdit(keywords=["Second"]),
         ExifEdit(keywords_remove=["Ærøskøbing"])],
    )  # fmt: skip
    # and one job on the other with the same net change
    after_one = _jobs(one, [ExifEdit(keywords=[LONG, EMOJI, "Second"])])
    # Then every keyword store of the two is identical
    stores = _stores(after_three)
    assert stores == _stores(after_one)
    # and holds the three keywords once each: no IPTC cut, no mangled emoji came back as a keyword
    assert _listed(stores["XMP-dc:Subject"]) == [LONG, EMOJI, "Second"]
    assert len(_listed(stores["IPTC:Keywords"])) == 3
    cut = _listed(stores["IPTC:Keywords"])[0]  # IPTC's own copy: cut at a character boundary
    assert LONG.startswith(cut) and 60 < len(cut.encode()) <= 64
    # XPKeywords (UCS-2) holds the two it can hold: the emoji is left out, never junk (issue 40)
    assert str(stores["IFD0:XPKeywords"]).split(";") == [LONG, "Second"]
    assert read_metadata(after_three)["keywords"] == [LONG, EMOJI, "Second"]


def test_keywords_merge_case_insensitively_keeping_the_first_spelling(tmp_path: Path) -> None:
    # Given a photo tagged "Beach" (as Lightroom would write it)
    src = _camera_jpeg(tmp_path, "beach.jpg")
    tagged = _jobs(src, [ExifEdit(keywords=["Beach"])])
    # When a job adds "beach", "BEACH" and "Sea"
    out = _jobs(tagged, [ExifEdit(keywords=["beach", "BEACH", "Sea"])])
    # Then "Beach" is one keyword, spelt as it first was, in every store
    stores = _stores(out)
    for key in ("XMP-dc:Subject", "IPTC:Keywords"):
        assert _listed(stores[key]) == ["Beach", "Sea"], key
    assert stores["IFD0:XPKeywords"] == "Beach;Sea"
    assert ExifEdit(keywords=["a", "A", "b"]).keywords == ["a", "b"]


def test_a_removal_removes_the_keyword_from_every_store_that_lists_it(tmp_path: Path) -> None:
    # Given a photo whose keyword "Beach" Windows, Lightroom and MediaPro listed in their own stores
    src = _camera_jpeg(tmp_path, "stores.jpg")
    ExifTool.shared().execute(
        "-overwrite_original",
        "-XMP-dc:Subject=Beach", "-XMP-dc:Subject=Family",
        "-XMP-lr:HierarchicalSubject=Places|Beach", "-XMP-lr:HierarchicalSubject=People|Family",
        "-IPTC:Keywords=Beach", "-IPTC:Keywords=Family", "-EXIF:XPKeywords=Beach;Family",
        "-XMP-microsoft:LastKeywordXMP=Beach", "-XMP-microsoft:LastKeywordXMP=Family",
        "-XMP-mediapro:CatalogSets=Places|Beach", "-XMP-mediapro:CatalogSets=People|Family",
        os.path.abspath(src),
    )  # fmt: skip
    # When a job removes "beach" (another case)
    out = _jobs(src, [ExifEdit(keywords_remove=["beach"])])
    # Then no store lists it any more, and "Family" is left everywhere
    stores = _stores(out)
    assert {k: _listed(v) for k, v in stores.items()} == {
        "XMP-dc:Subject": ["Family"],
        "XMP-lr:HierarchicalSubject": ["People|Family"],
        "IPTC:Keywords": ["Family"],
        "IFD0:XPKeywords": ["Family"],
        "XMP-microsoft:LastKeywordXMP": ["Family"],
        "XMP-mediapro:CatalogSets": ["People|Family"],
    }
