"""The photo lanes end to end with real workers: bad inputs, collisions, and a full pipeline. The
tests whose jobs need only healthy workers share a fleet of each store (tests/shared_fleet.py):
two workers of three threads on every photo lane, held while a test submits."""

from __future__ import annotations

import hashlib
import json
import shutil
import tarfile
import zipfile
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.errors import InvalidParameter
from photos.fileops import sha256_file
from store.jobs import list_jobs
from tests.shared_fleet import SharedFleet
from tests.support import (
    AWS_TEST_ENV,
    Fleet,
    MotoServer,
    event_counts,
    item_states,
    items_of,
    wait_job_done,
)

from .test_file_effects import all_files, store_paths_match_disk, temp_files
from .test_lanes_and_locks import work_intervals

LANES = ["analysis", "exif", "rename", "upload", "archive"]


def test_bad_inputs_fail_clearly_and_the_rest_finish(shared_fleet: SharedFleet, tmp_path: Path) -> None:
    engine = shared_fleet.engine
    # Given good photos, corrupt ones, a too-large image, unicode names, a file deleted after
    # submission, and eight photos taken in the same second by the same camera
    folder = tmp_path / "photos"
    good = generate_samples(folder, 4, seed=5, corrupt=3, size=(320, 240))[:4]
    Image.new("RGB", (2500, 2000), "navy").save(folder / "bomb.png")
    shutil.copy(good[0], folder / "Été à Paris 03.jpg")
    for i in range(8):
        shutil.copy(good[1], folder / f"burst {i}.jpg")
    shutil.copy(good[2], folder / "doomed.jpg")
    burst_sha = sha256_file(good[1])
    params = {"analysis.max_pixels": "4000000", "rename.pattern": "{taken:%Y%m%d_%H%M%S}_{camera}{ext}"}
    with shared_fleet.held(LANES, threads=3, workers=2) as client:
        job = client.submit(["analysis", "rename"], [folder], params).job_id
        (folder / "doomed.jpg").unlink()
    # When the job runs
    wait_job_done(engine, job, 120)
    # Then each bad file failed in analysis with its own clear reason, naming the file
    with_paths = {i.id: i for i in items_of(engine, job)}
    failed = {Path(i.error.split(":")[0]).name: i.error for i in with_paths.values() if i.state == "failed"}
    assert set(failed) == {
        "corrupt_empty_01.jpg",
        "corrupt_truncated_02.jpg",
        "corrupt_text_03.jpg",
        "bomb.png",
        "doomed.jpg",
    }, failed
    assert "empty" in failed["corrupt_empty_01.jpg"]
    assert "truncated" in failed["corrupt_truncated_02.jpg"]
    assert "not an image" in failed["corrupt_text_03.jpg"]
    assert "pixels" in failed["bomb.png"]
    assert "not found" in failed["doomed.jpg"] or "No such file" in failed["doomed.jpg"]
    # And their rename items ran all the same (rename needs no analysis: a move never decodes a
    # photo), only the deleted file's failing, again naming it; nothing was skipped
    assert not [i for i in with_paths.values() if i.state == "skipped"]
    rename_failed = [i.error or "" for i in with_paths.values() if i.lane == "rename" and i.state == "failed"]
    assert len(rename_failed) == 1 and "doomed.jpg" in rename_failed[0]
    # And the good ones (including the unicode name) were renamed; the burst got distinct suffixes
    renamed = [Path(i.result["target"]) for i in with_paths.values() if i.lane == "rename" and i.result]
    assert len(renamed) == 4 + 1 + 8 + 4 and len(set(renamed)) == len(renamed)
    burst = sorted(p.name for p in renamed if sha256_file(p) == burst_sha)
    stem = burst[0].rsplit(".", 1)[0]
    assert burst == sorted([f"{stem}.jpg"] + [f"{stem}_{n}.jpg" for n in range(1, 9)])
    assert temp_files(folder) == []
    store_paths_match_disk(engine, deleted=frozenset({"doomed.jpg"}), under=tmp_path)
    client.engine.dispose()


@pytest.mark.parametrize("pattern", ["../{stem}{ext}", "/etc/{stem}{ext}", "a/../../{stem}{ext}"])
def test_rename_pattern_escaping_the_root_is_refused_at_submission(
    engine: Engine, env: dict[str, str], tmp_path: Path, pattern: str
) -> None:
    # Given photos
    folder = tmp_path / "photos"
    generate_samples(folder, 1, size=(64, 48))
    client = Client(Settings.from_env(env))
    # When a job asks for a pattern that would leave the root
    with pytest.raises(InvalidParameter) as refused:
        client.submit(["rename"], [folder], {"rename.pattern": pattern})
    # Then it is refused with a specific message and nothing is written
    assert "rename.pattern" in str(refused.value)
    assert list_jobs(engine) == []
    client.engine.dispose()


def test_full_pipeline_over_generated_photos(shared_fleet: SharedFleet, tmp_path: Path) -> None:
    engine = shared_fleet.engine
    # Given 150 realistic photos
    folder = tmp_path / "photos"
    generate_samples(folder, 150, seed=3, size=(640, 480))
    # When they go through analysis, exif, rename, upload and archive on two workers
    with shared_fleet.held(LANES, threads=3, workers=2) as client:
        job = client.submit(LANES, [folder], {"exif.keywords": "pipeline,test", "exif.rating": "5"}).job_id
    wait_job_done(engine, job, 300)
    # Then every item succeeded exactly once
    assert {i.state for i in items_of(engine, job)} == {"succeeded"}
    counts = event_counts(engine, "item_succeeded", job)
    assert len(counts) == 150 * 5 and set(counts.values()) == {1}
    # And every photo is in the archive exactly once, its upload holds the same bytes, nothing is left
    archived = all_files(Path(f"{folder}-archive"))
    uploaded = all_files(Path(f"{folder}-uploads"))
    assert len(archived) == 150 and all_files(folder) == []
    assert sorted(sha256_file(p) for p in archived) == sorted(sha256_file(p) for p in uploaded)
    assert temp_files(folder, Path(f"{folder}-archive"), Path(f"{folder}-uploads")) == []
    store_paths_match_disk(engine, under=tmp_path)
    client.engine.dispose()


@pytest.mark.parametrize("kind", ["zip", "tar"])
def test_archive_bundle_holds_every_photo_with_a_verified_manifest(
    shared_fleet: SharedFleet, tmp_path: Path, kind: str
) -> None:
    engine = shared_fleet.engine
    # Given 12 photos (two corrupt) and, at the same time, an EXIF job on the same photos
    folder = tmp_path / "photos"
    made = generate_samples(folder, 10, seed=4, corrupt=2, size=(320, 240))
    with shared_fleet.held(LANES, threads=3, workers=2) as client:
        bundle_job = client.submit(["analysis", "archive"], [folder], {"archive.bundle": kind}).job_id
        exif_job = client.submit(["exif"], [folder], {"exif.rating": "2"}).job_id
    # When both run on two workers
    for job in (bundle_job, exif_job):
        wait_job_done(engine, job, 120)
    # Then one bundle holds all twelve (the corrupt ones failed analysis, but an archive needs no
    # analysis: the backup comes first), its manifest checks out
    [bundle_item] = [i for i in items_of(engine, bundle_job) if i.lane == "archive"]
    assert bundle_item.state == "succeeded" and bundle_item.result["photos"] == 12
    bundle = Path(bundle_item.result["bundle"])
    assert bundle.name == f"photojobs-job{bundle_job}.{kind}"
    from photos.archive import verify_bundle

    names = _bundle_names(bundle, kind)
    manifest = json.loads(_bundle_read(bundle, kind, "MANIFEST.json"))
    verify_bundle(bundle, manifest)
    assert len(manifest["members"]) == 12 and len(names) == 13
    # And the originals are all still in place (a bundle copies), the EXIF job succeeded on the good ones
    assert all(p.exists() for p in made)
    assert item_states(engine, exif_job).get("succeeded") == 10
    # And the bundle's exclusive locks on its photos never overlapped EXIF work on them
    intervals = work_intervals(engine)
    [(b0, b1)] = [
        (s, e) for spans in [intervals.get(None, [])] for s, e, _lane, item in spans if item == bundle_item.id
    ]
    for photo, spans in intervals.items():
        for s0, s1, lane, _item in spans:
            if photo is not None and lane == "exif":
                assert not (s0 < b1 and b0 < s1), f"exif on photo {photo} overlapped the bundle"
    assert temp_files(folder, Path(f"{folder}-archive")) == []
    client.engine.dispose()


def _bundle_names(path: Path, kind: str) -> list[str]:
    if kind == "zip":
        with zipfile.ZipFile(path) as z:
            return z.namelist()
    with tarfile.open(path) as t:
        return t.getnames()


def _bundle_read(path: Path, kind: str, name: str) -> bytes:
    if kind == "zip":
        with zipfile.ZipFile(path) as z:
            return z.read(name)
    with tarfile.open(path) as t:
        member = t.extractfile(name)
        assert member is not None
        return member.read()


def test_upload_lane_to_s3_compatible_storage_is_verified_and_idempotent(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a real S3-compatible server (moto) on loopback with a bucket, and 8 photos
    moto = MotoServer(tmp_path)
    endpoint = moto.start()
    try:
        env = {**env, **AWS_TEST_ENV}
        s3 = moto.s3_client("photos")
        folder = tmp_path / "photos"
        made = generate_samples(folder, 8, seed=8, size=(320, 240))
        client = Client(Settings.from_env(env))
        params = {"upload.target": "s3://photos/backup", "upload.endpoint": endpoint}
        # When an upload job runs, and then the same upload again as a second job
        first = client.submit(["upload"], [folder], params).job_id
        fleet.env = env
        fleet.start_sweeper()
        fleet.start_worker(["upload"], threads=2)
        wait_job_done(engine, first, 120)
        second = client.submit(["upload"], [folder], params).job_id
        wait_job_done(engine, second, 120)
        # Then every photo is in the bucket under its content-addressed key with the same bytes
        objects = s3.list_objects_v2(Bucket="photos", Prefix="backup/")["Contents"]
        assert len(objects) == 8
        want = {sha256_file(p) for p in made}
        got = {
            hashlib.sha256(s3.get_object(Bucket="photos", Key=o["Key"])["Body"].read()).hexdigest()
            for o in objects
        }
        assert got == want
        # And the repeat was a no-op: every item of the second job found its object already there
        assert item_states(engine, first) == {"succeeded": 8} and item_states(engine, second) == {
            "succeeded": 8
        }
        assert all(i.result["already_present"] for i in items_of(engine, second))
        assert not any(i.result["already_present"] for i in items_of(engine, first))
        client.engine.dispose()
    finally:
        moto.stop()
