"""The photo lanes end to end with real workers: bad inputs, collisions, and a full pipeline."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from PIL import Image
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photos.errors import InvalidParameter
from photos.fileops import sha256_file
from photos.samples import generate_samples
from store.jobs import list_jobs
from tests.support import Fleet, event_counts, items_of, job_done, wait_for

from .test_file_effects import all_files, store_paths_match_disk, temp_files


def test_bad_inputs_fail_clearly_and_the_rest_finish(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
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
    client = Client(Settings.from_env(env))
    params = {"analysis.max_pixels": "4000000", "rename.pattern": "{taken:%Y%m%d_%H%M%S}_{camera}{ext}"}
    job = client.submit(["analysis", "rename"], [folder], params).job_id
    (folder / "doomed.jpg").unlink()
    # When the job runs
    fleet.start_sweeper()
    fleet.start_worker(["analysis", "rename"], threads=2)
    wait_for(lambda: job_done(engine, job), 120, what="the job to finish")
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
    # And their rename items were skipped with the reason, never run
    skipped = [i for i in with_paths.values() if i.state == "skipped"]
    assert len(skipped) == 5 and all("analysis failed" in (i.error or "") for i in skipped)
    # And the good ones (including the unicode name) were renamed; the burst got distinct suffixes
    renamed = [Path(i.result["target"]) for i in with_paths.values() if i.lane == "rename" and i.result]
    assert len(renamed) == 4 + 1 + 8 and len(set(renamed)) == len(renamed)
    burst = sorted(p.name for p in renamed if sha256_file(p) == burst_sha)
    stem = burst[0].rsplit(".", 1)[0]
    assert burst == sorted([f"{stem}.jpg"] + [f"{stem}_{n}.jpg" for n in range(1, 9)])
    assert temp_files(folder) == []
    store_paths_match_disk(engine, deleted=frozenset({"doomed.jpg"}))
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


def test_full_pipeline_over_generated_photos(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given 150 realistic photos
    folder = tmp_path / "photos"
    generate_samples(folder, 150, seed=3, size=(640, 480))
    client = Client(Settings.from_env(env))
    lanes = ["analysis", "exif", "rename", "upload", "archive"]
    # When they go through analysis, exif, rename, upload and archive on two workers
    job = client.submit(lanes, [folder], {"exif.keywords": "pipeline,test", "exif.rating": "5"}).job_id
    fleet.start_sweeper()
    fleet.start_worker(lanes, threads=3)
    fleet.start_worker(lanes, threads=3)
    wait_for(lambda: job_done(engine, job), 300, what="the pipeline to finish")
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
    store_paths_match_disk(engine)
    client.engine.dispose()
