"""AVIF and JPEG XL are photos in every lane that needs no metadata write: a folder scan takes them,
analysis reads them (Pillow's AVIF, pillow-jxl-plugin's JXL) with their displayed size, rename names
them by their capture time and displayed size, upload and archive copy and move them byte-identical.
Real store (SQLite and PostgreSQL), real files, each lane's own code run item by item."""

from __future__ import annotations

from pathlib import Path

import pillow_jxl  # noqa: F401 - Pillow's JPEG XL plugin (writes the sample)
from PIL import Image
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photos.fileops import sha256_file
from tests.inline_lanes import run_lane


def phone_photo(path: Path) -> Path:
    """A phone's picture: stored 64x40, shown turned a quarter (orientation 6), with its camera and time."""
    exif = Image.Exif()
    exif[0x010F], exif[0x0110], exif[0x0112] = "Apple", "iPhone 15", 6
    exif.get_ifd(0x8769)[0x9003] = "2023:09:27 14:35:33"
    Image.new("RGB", (64, 40), (200, 100, 10)).save(path, exif=exif.tobytes())
    return path


def test_avif_and_jxl_through_analysis_rename_upload_and_archive(engine: Engine, tmp_path: Path) -> None:
    # Given a phone folder with an AVIF and a JPEG XL
    folder = tmp_path / "phone"
    folder.mkdir()
    avif, jxl = phone_photo(folder / "IMG_1.avif"), phone_photo(folder / "IMG_2.jxl")
    shas = {"avif": sha256_file(avif), "jxl": sha256_file(jxl)}
    uploads, archive = tmp_path / "uploads", tmp_path / "archive"
    params = {"rename.pattern": "{taken:%Y%m%d_%H%M%S}_{camera}_{width}x{height}_{stem}{ext}",
              "upload.target": str(uploads), "archive.root": str(archive)}  # fmt: skip
    client = Client(Settings.from_env({}), engine=engine)
    job = client.submit(["analysis", "rename", "upload", "archive"], [folder], params)
    assert job.photos == 2 and job.left_out == []
    # When each lane runs over both
    facts = run_lane(engine, job.job_id, "analysis")
    renamed = run_lane(engine, job.job_id, "rename")
    uploaded = run_lane(engine, job.job_id, "upload")
    archived = run_lane(engine, job.job_id, "archive")
    # Then analysis read each format with its stored and displayed size and its capture time
    by_format = {f["format"]: f for f in facts.values()}
    assert set(by_format) == {"AVIF", "JXL"}
    for f in by_format.values():
        assert (f["width"], f["height"], f["display_width"], f["display_height"]) == (64, 40, 40, 64)
        assert (f["taken"], f["taken_from"]) == ("2023-09-27T14:35:33", "EXIF DateTimeOriginal")
    # and rename named them by capture time and displayed size, keeping the extension
    assert sorted(Path(r["target"]).name for r in renamed.values()) == [
        "20230927_143533_apple-iphone-15_40x64_IMG_1.avif", "20230927_143533_apple-iphone-15_40x64_IMG_2.jxl",
    ]  # fmt: skip
    # and upload and archive copied and moved them byte-identical
    assert sorted(sha256_file(p) for p in uploads.rglob("*") if p.is_file()) == sorted(shas.values())
    assert all(r.get("target") or r.get("location") for r in uploaded.values())
    moved = {p.suffix: p for p in archive.rglob("*") if p.is_file()}
    assert {k: sha256_file(p) for k, p in moved.items()} == {".avif": shas["avif"], ".jxl": shas["jxl"]}
    assert all("2023/2023-09-27" in r["target"] for r in archived.values())
    assert list(folder.rglob("*")) == []
