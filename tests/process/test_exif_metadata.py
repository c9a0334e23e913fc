"""The exif lane through real workers: metadata photo apps read, nothing else touched, and rename
names that stay stable across later edits (the fallback time is the one recorded at submission)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

from PIL import Image
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photos.exiftool import ExifTool
from tests.fixtures import camera_corpus, metadata_files
from tests.support import Fleet, item_states, items_of, job_done, wait_for

from .test_file_effects import all_files, store_paths_match_disk, temp_files

PATTERN = "{taken:%Y%m%d_%H%M%S}_{stem}{ext}"
SUBMITTED_MTIME = datetime(2010, 3, 4, 5, 6, 7).timestamp()


def _run(client: Client, engine: Engine, lanes: list[str], folder: Path, params: dict[str, str]) -> int:
    job = client.submit(lanes, [folder], params).job_id
    wait_for(
        lambda: job_done(engine, job), 180, what=f"job {job} ({lanes}) to finish: {item_states(engine, job)}"
    )
    assert item_states(engine, job) == {"succeeded": len(items_of(engine, job))}, [
        (i.lane, i.error) for i in items_of(engine, job)
    ]
    return job


def _dump(path: Path) -> dict[str, object]:
    out = ExifTool.shared().execute("-j", "-G1", "-a", "-u", "-b", os.path.abspath(path))
    return json.loads(out, parse_int=str, parse_float=str)[0]


def test_an_undated_photo_keeps_its_name_across_later_edits(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a photo without any capture time, whose file time says 2010-03-04 05:06:07
    folder = tmp_path / "photos"
    folder.mkdir()
    photo = folder / "scan sans date.jpg"
    Image.new("RGB", (64, 48), "teal").save(photo, "JPEG")
    os.utime(photo, (SUBMITTED_MTIME, SUBMITTED_MTIME))
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    fleet.start_worker(["exif", "rename"], threads=2)
    # When it is renamed after its file time
    _run(client, engine, ["rename"], folder, {"rename.pattern": PATTERN})
    (first,) = all_files(folder)
    assert first.name == "20100304_050607_scan sans date.jpg"
    # and then edited by an EXIF job, and touched by some other program
    _run(client, engine, ["exif"], folder, {"exif.keywords": "scan,archive", "exif.rating": "2"})
    os.utime(first, None)
    # and renamed again with the same pattern
    _run(client, engine, ["rename"], folder, {"rename.pattern": PATTERN.replace("{stem}", "again")})
    # Then the name still comes from the time recorded at the first submission, not from the edit
    (second,) = all_files(folder)
    assert second.name == "20100304_050607_again.jpg"
    assert _dump(second)["XMP-dc:Subject"] == ["scan", "archive"]
    assert temp_files(folder) == []
    store_paths_match_disk(engine)
    client.engine.dispose()


def test_keywords_from_the_exif_lane_are_visible_to_photo_apps(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given camera files with a MakerNote, thumbnails, odd layouts and the owner's UserComment
    corpus = camera_corpus.make_corpus(tmp_path / "photos")
    folder = tmp_path / "photos"
    before = {p.name: (_dump(p), p.stat().st_mtime_ns) for p in corpus.values()}
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    fleet.start_worker(["exif"], threads=2)
    # When the real exif lane writes keywords and a rating
    _run(client, engine, ["exif"], folder, {"exif.keywords": "plage,Été à Paris", "exif.rating": "5"})
    # Then exiftool sees the keywords where Lightroom, digiKam and Immich read them
    makernotes = 0
    for path in all_files(folder):
        after = _dump(path)
        old, mtime = before[path.name]
        assert after["XMP-dc:Subject"] == ["plage", "Été à Paris"], path.name
        if path.suffix in (".jpg", ".tif"):
            assert after["IPTC:Keywords"] == ["plage", "Été à Paris"], path.name
        assert str(after["XMP-xmp:Rating"]) == "5"
        # and the owner's UserComment, the MakerNote, the thumbnail and the file time are kept
        assert after["ExifIFD:UserComment"] == old["ExifIFD:UserComment"], path.name
        for key in ("IFD1:ThumbnailImage", "InteropIFD:InteropVersion", "IFD0:WhiteBalance", "IFD0:Make"):
            assert after.get(key) == old.get(key), (path.name, key)
        maker = {k: v for k, v in old.items() if k.startswith(("Kodak:", "Canon:"))}
        assert {k: after.get(k) for k in maker} == maker, path.name
        makernotes += bool(maker)
        assert path.stat().st_mtime_ns == mtime, path.name
    assert makernotes >= 4
    assert temp_files(folder) == []
    store_paths_match_disk(engine)
    client.engine.dispose()


def test_a_jpeg_and_its_sidecar_are_edited_together_and_a_fix_exiftool_made_is_recorded(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a JPEG with Lightroom's sidecar (its own keyword and capture time), and a JPEG Windows
    # touched (exiftool reads its XMP with "[minor] Fixed incorrect URI for xmlns:MicrosoftPhoto")
    folder = tmp_path / "photos"
    folder.mkdir()
    photo = folder / "IMG_1.jpg"
    photo.write_bytes(camera_corpus._jpeg_with_exif(camera_corpus.exif_layout("interop"), (64, 48), 1))
    sidecar = folder / "IMG_1.xmp"
    ExifTool.shared().execute(
        "-o", os.path.abspath(sidecar), "-XMP-dc:Subject=family",
        "-XMP-exif:DateTimeOriginal=2005:08:13 09:47:23",
    )  # fmt: skip
    windows = metadata_files.windows_jpeg(folder / "windows.jpg")
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    fleet.start_worker(["exif"], threads=2)
    # When the real exif lane adds a keyword and shifts the time
    job = _run(client, engine, ["exif"], folder, {"exif.keywords": "beach", "exif.shift": "+1h"})
    # Then the photo and its sidecar agree: both have the keyword and the shifted time
    assert _dump(photo)["XMP-dc:Subject"] == "beach"
    assert _dump(photo)["ExifIFD:DateTimeOriginal"] == "2005:08:13 10:47:23"
    side = _dump(sidecar)
    assert side["XMP-dc:Subject"] == ["family", "beach"]
    assert side["XMP-exif:DateTimeOriginal"] == "2005:08:13 10:47:23"
    results = {Path(i.result["target"]).name: i.result for i in items_of(engine, job)}
    assert results["IMG_1.jpg"]["sidecar"] == str(sidecar)
    # and the Windows photo was written, the fix exiftool made named in its item's result
    assert _dump(windows)["XMP-dc:Subject"] == ["Beach", "Family"]  # "beach" was there as "Beach"
    fixed = results["windows.jpg"]["exiftool_fixed"]
    assert fixed == ["[minor] Fixed incorrect URI for xmlns:MicrosoftPhoto"]
    assert temp_files(folder) == []
    store_paths_match_disk(engine)
    client.engine.dispose()
