"""A photo replaced by a symlink to an outside file INSIDE the gap between a lane's containment check
and its use (issue 20): real workers pause right after the check (failpoint ``<lane>.after_check:wait``),
the test swaps the photo, then lets them go. No lane reads, copies or moves the outside file. Real
workers, Redis, exiftool, both stores."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photos.samples import generate_samples
from tests.support import Fleet, items_of, job_done, wait_for

PARAMS: dict[str, dict[str, Any]] = {
    "analysis": {},
    "exif": {"exif.rating": 5},
    "rename": {"rename.pattern": "renamed_{taken:%Y%m%d_%H%M%S}{ext}"},
    "archive": {},  # archive.root is set per test
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entries(folder: Path) -> list[Path]:
    """Every file and symlink under ``folder`` (sorted)."""
    return sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()) if folder.exists() else []


def swap_inside_the_gap(
    lane: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> tuple[int, Path, Path, str, str]:
    """Submit a ``lane`` job for one photo; its worker pauses right after checking the photo, the
    photo is then replaced by a symlink to an outside JPEG of another size, and the worker goes on.
    Returns the job, the photo's path, the outside file, and the photo's and outside file's hashes."""
    photos = tmp_path / "photos"
    (photo,) = generate_samples(photos, 1, seed=1, size=(64, 48))
    (outside,) = generate_samples(tmp_path / "outside", 1, seed=9, size=(32, 24))
    photo_sha, outside_sha = sha(photo), sha(outside)
    gate = tmp_path / "failpoints"
    gate.mkdir()
    params = dict(PARAMS[lane])
    if lane == "archive":
        params["archive.root"] = str(tmp_path / "archive")
    job = Client(Settings.from_env(env)).submit([lane], [photos], params).job_id
    fleet.start_sweeper()
    fleet.start_worker(
        [lane],
        threads=1,
        env={"PHOTOJOBS_FAILPOINTS": f"{lane}.after_check:wait", "PHOTOJOBS_FAILPOINT_DIR": str(gate)},
    )
    wait_for(lambda: (gate / f"{lane}.after_check.reached").exists(), 90, what=f"{lane} past its check")
    photo.unlink()
    photo.symlink_to(outside)
    (gate / f"{lane}.after_check.go").touch()
    wait_for(lambda: job_done(engine, job), 120, what=f"the {lane} job to end")
    return job, photo, outside, photo_sha, outside_sha


def test_analysis_reads_the_checked_photo_not_a_symlink_swapped_in_after_the_check(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an analysis worker that checked the photo, whose path is then swapped for a symlink to
    # an outside JPEG before the worker reads it
    job, photo, outside, photo_sha, outside_sha = swap_inside_the_gap(
        "analysis", engine, env, fleet, tmp_path
    )
    # Then the facts are those of the photo that was checked (its bytes, read through the checked
    # descriptor), not of the outside file
    (item,) = items_of(engine, job)
    assert item.state == "succeeded", item.error
    assert item.result is not None
    assert (item.result["sha256"], item.result["width"], item.result["height"]) == (photo_sha, 64, 48)
    assert item.result["sha256"] != outside_sha
    # And the outside file is unchanged
    assert sha(outside) == outside_sha and photo.is_symlink()


def test_exif_never_copies_an_outside_file_swapped_in_after_the_check(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an exif worker that checked the photo, whose path is then swapped for a symlink to an
    # outside JPEG before exiftool reads it
    job, photo, outside, _photo_sha, outside_sha = swap_inside_the_gap("exif", engine, env, fleet, tmp_path)
    # Then the item fails: what is at the path is not the photo it edited
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.result
    assert "replaced" in (item.error or ""), item.error
    # And nothing was written: the folder holds the symlink only (no edited copy of the outside
    # file, no staged file), and the outside file is unchanged
    assert entries(photo.parent) == [photo] and photo.is_symlink()
    assert sha(outside) == outside_sha


@pytest.mark.parametrize("lane", ["rename", "archive"])
def test_a_move_never_moves_a_symlink_swapped_in_after_the_check(
    lane: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a rename/archive worker that checked the photo, whose path is then swapped for a symlink
    # to an outside JPEG before the move
    job, photo, outside, _photo_sha, outside_sha = swap_inside_the_gap(lane, engine, env, fleet, tmp_path)
    # Then the item fails: the photo was replaced since it was checked
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.result
    assert "replaced" in (item.error or ""), item.error
    # And nothing moved: the symlink stays where it was, no staged link is left, nothing reached the
    # archive, and the outside file is unchanged
    assert entries(photo.parent) == [photo] and photo.is_symlink()
    assert entries(tmp_path / "archive") == []
    assert sha(outside) == outside_sha
