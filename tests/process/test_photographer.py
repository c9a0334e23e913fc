"""A photographer's job through real workers (issue 21): a time shift and a rename in one job name
every photo after its shifted time, and an exif-only job leaves a file that does not decode as it was.
The tests share a fleet of each store (tests/shared_fleet.py): healthy workers on ``LANES``."""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime
from pathlib import Path

from photojobs.testing import samples
from photos.exiftool import ExifTool
from tests import clock_photos
from tests.shared_fleet import SharedFleet
from tests.support import item_states, items_of, run_job

from .test_file_effects import all_files, store_paths_match_disk, temp_files

PATTERN = "{taken:%Y-%m-%d_%H%M%S}_{stem}{ext}"
LANES = ["analysis", "exif", "rename", "archive"]  # the shared workers' (each job runs some)


def _original_time(path: Path) -> str:
    out = ExifTool.shared().execute("-j", "-G1", "-ExifIFD:DateTimeOriginal", os.path.abspath(path))
    return json.loads(out)[0]["ExifIFD:DateTimeOriginal"]


def test_shift_and_rename_in_one_job_name_every_photo_after_its_shifted_time(
    shared_fleet: SharedFleet, tmp_path: Path
) -> None:
    engine = shared_fleet.engine
    # Given Pentax and Nikon photos taken late in the evening (a +1h shift moves them to the next
    # day) and in the morning, with XMP and IPTC clocks too
    folder = tmp_path / "photos"
    times = {
        "late pentax": ("pentax", "2004:10:02 23:29:52"),
        "late nikon": ("nikon", "2004:12:31 23:59:30"),
        "morning pentax": ("pentax", "2005:06:01 08:00:00"),
        "morning nikon": ("nikon", "2005:06:01 09:15:07"),
    }
    for seed, (stem, (maker, taken)) in enumerate(times.items()):
        photo = clock_photos.camera_jpeg(folder / f"{stem}.jpg", maker, taken, seed=seed)
        clock_photos.add_xmp_and_iptc(photo, taken)
    client = shared_fleet.serve(LANES)
    # When one job analyses them, shifts them by +1h and renames them by capture time
    params = {"exif.shift": "+1h", "rename.pattern": PATTERN}
    job = run_job(client, engine, None, ["analysis", "exif", "rename"], folder, params)
    assert item_states(engine, job) == {"succeeded": len(items_of(engine, job))}, [
        (i.lane, i.error) for i in items_of(engine, job)
    ]
    # Then the exif lane recorded each photo's new capture time
    assert sorted(i.result["taken"] for i in items_of(engine, job) if i.lane == "exif") == [
        "2004-10-03T00:29:52", "2005-01-01T00:59:30", "2005-06-01T09:00:00", "2005-06-01T10:15:07"
    ]
    # and every name is the photo's shifted DateTimeOriginal, including across midnight and the year
    names = {}
    for path in all_files(folder):
        taken = datetime.strptime(_original_time(path), "%Y:%m:%d %H:%M:%S")
        assert path.name.startswith(taken.strftime("%Y-%m-%d_%H%M%S") + "_"), (path.name, taken)
        names[path.name.split("_", 2)[2]] = path.name.split("_", 2)[0]
    assert names == {
        "late pentax.jpg": "2004-10-03",
        "late nikon.jpg": "2005-01-01",
        "morning pentax.jpg": "2005-06-01",
        "morning nikon.jpg": "2005-06-01",
    }
    assert temp_files(folder) == []
    store_paths_match_disk(engine, under=tmp_path)
    client.engine.dispose()


def test_shift_and_archive_in_one_job_file_the_photo_under_its_shifted_day(
    shared_fleet: SharedFleet, tmp_path: Path
) -> None:
    engine = shared_fleet.engine
    # Given a Nikon photo taken on New Year's Eve, half a minute before midnight
    folder = tmp_path / "photos"
    photo = clock_photos.camera_jpeg(folder / "party.jpg", "nikon", "2004:12:31 23:59:30")
    clock_photos.add_xmp_and_iptc(photo, "2004:12:31 23:59:30")
    client = shared_fleet.serve(LANES)
    # When one job analyses it, shifts it by +1m and archives it into dated folders
    job = run_job(client, engine, None, ["analysis", "exif", "archive"], folder, {"exif.shift": "+1m"})
    assert item_states(engine, job) == {"succeeded": 3}, [(i.lane, i.error) for i in items_of(engine, job)]
    # Then it is filed under the new year's day its DateTimeOriginal now says
    (archived,) = all_files(tmp_path / "photos-archive")
    assert _original_time(archived) == "2005:01:01 00:00:30"
    assert archived.relative_to(tmp_path / "photos-archive").as_posix() == "2005/2005-01-01/party.jpg"
    client.engine.dispose()


def test_an_exif_only_job_leaves_a_file_that_does_not_decode_byte_identical(
    shared_fleet: SharedFleet, tmp_path: Path
) -> None:
    engine = shared_fleet.engine
    # Given a good photo and a JPEG whose structure exiftool accepts but whose Huffman table is
    # garbage (Pillow cannot decode it)
    folder = tmp_path / "photos"
    folder.mkdir()
    good = folder / "good.jpg"
    samples._pattern((64, 48)).save(good, "JPEG")
    data = bytearray(good.read_bytes())
    dht = data.find(b"\xff\xc4")
    length = int.from_bytes(data[dht + 2 : dht + 4], "big")
    data[dht + 5 : dht + 2 + length] = b"\xff" * (length - 3)
    bad = folder / "corrupt.jpg"
    bad.write_bytes(bytes(data))
    sha = hashlib.sha256(bad.read_bytes()).hexdigest()
    mtime = bad.stat().st_mtime_ns
    client = shared_fleet.serve(LANES)
    # When a job with only the exif lane writes keywords
    job = run_job(client, engine, None, ["exif"], folder, {"exif.keywords": "kw"})
    # Then the corrupt file fails with a clear error and is byte-identical, the good one is written
    states = sorted((i.state, i.error or "") for i in items_of(engine, job))
    assert [s for s, _ in states] == ["failed", "succeeded"], states
    assert "corrupt.jpg" in states[0][1] and "does not decode" in states[0][1], states
    assert hashlib.sha256(bad.read_bytes()).hexdigest() == sha and bad.stat().st_mtime_ns == mtime
    assert temp_files(folder) == []
    client.engine.dispose()
