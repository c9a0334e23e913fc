"""A photo replaced by a symlink to an outside file INSIDE the gap between a lane's containment check
and its use (issue 20): real workers pause right after the check (failpoint ``<lane>.after_check:wait``),
the test swaps the photo, then lets them go. No lane reads, copies or moves the outside file: the
kernel (inotify) reports every read of it by any process, and there is none. Real workers, Redis,
exiftool, both stores."""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from tests.raw_support import make_raw, preview_jpeg
from tests.support import Fleet, items_of, job_done, wait_for

PARAMS: dict[str, dict[str, Any]] = {
    "analysis": {},
    "exif": {"exif.rating": 5},
    "rename": {"rename.pattern": "renamed_{taken:%Y%m%d_%H%M%S}{ext}"},
    "archive": {},  # archive.root is set per test
    "upload": {},  # upload.target is set per test
}


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def entries(folder: Path) -> list[Path]:
    """Every file and symlink under ``folder`` (sorted)."""
    found = (p for p in folder.rglob("*") if HISTORY not in p.parts)
    return sorted(p for p in found if p.is_file() or p.is_symlink()) if folder.exists() else []


@contextmanager
def reads_of(path: Path) -> Iterator[list[int]]:
    """Watch ``path`` with inotify (IN_ACCESS: a read by any process, through any name); the list
    yielded holds the number of reads seen once the block ends."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
    assert fd >= 0, os.strerror(ctypes.get_errno())
    in_access = 0x1
    assert libc.inotify_add_watch(fd, os.fsencode(path), in_access) >= 0, os.strerror(ctypes.get_errno())
    seen: list[int] = []
    try:
        yield seen
        count = 0
        while True:
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                break
            count += len(data) // 16  # events on a file carry no name: 16 bytes each
        seen.append(count)
    finally:
        os.close(fd)


def swap_inside_the_gap(
    lane: str,
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    tmp_path: Path,
    point: str = "after_check",
    extra: dict[str, Any] | None = None,
) -> tuple[int, Path, Path, str, str]:
    """Submit a ``lane`` job for one photo; its worker pauses right after checking the photo (at
    failpoint ``<lane>.<point>``), the photo is then replaced by a symlink to an outside JPEG of
    another size, and the worker goes on. Asserts the outside file was never read meanwhile.
    Returns the job, the photo's path, the outside file, and the photo's and outside file's hashes."""
    photos = tmp_path / "photos"
    (photo,) = generate_samples(photos, 1, seed=1, size=(64, 48))
    (outside,) = generate_samples(tmp_path / "outside", 1, seed=9, size=(32, 24))
    photo_sha, outside_sha = sha(photo), sha(outside)
    with reads_of(outside) as reads:
        job = _run_with_swap(lane, engine, env, fleet, tmp_path, point, photo, outside, extra or {})
    assert reads == [0], f"the {lane} lane read the outside file {reads[0]} time(s)"
    return job, photo, outside, photo_sha, outside_sha


def _run_with_swap(
    lane: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path, point: str,
    photo: Path, outside: Path, extra: dict[str, Any],
) -> int:  # fmt: skip
    photos = photo.parent
    gate = tmp_path / "failpoints"
    gate.mkdir()
    params = {**PARAMS[lane], **extra}
    if lane == "archive":
        params["archive.root"] = str(tmp_path / "archive")
    if lane == "upload":
        params["upload.target"] = str(tmp_path / "uploads")
    job = Client(Settings.from_env(env)).submit([lane], [photos], params).job_id
    fleet.start_sweeper()
    fleet.start_worker(
        [lane],
        threads=1,
        env={"PHOTOJOBS_FAILPOINTS": f"{lane}.{point}:wait", "PHOTOJOBS_FAILPOINT_DIR": str(gate)},
    )
    wait_for(lambda: (gate / f"{lane}.{point}.reached").exists(), 90, what=f"{lane} past its check")
    photo.unlink()
    photo.symlink_to(outside)
    (gate / f"{lane}.{point}.go").touch()
    wait_for(lambda: job_done(engine, job), 120, what=f"the {lane} job to end")
    return job


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


def test_a_move_never_reads_the_time_of_a_symlink_swapped_in_before_it_names_the_photo(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a rename worker that checked the photo and is about to read its capture time for the
    # new name, the photo's path then swapped for a symlink to an outside JPEG
    job, photo, outside, _photo_sha, outside_sha = swap_inside_the_gap(
        "rename", engine, env, fleet, tmp_path, point="facts_after_check"
    )  # (the outside file was never read: asserted in swap_inside_the_gap)
    # Then the item fails (the move's own check finds the path outside the roots) and nothing moved
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.result
    assert entries(photo.parent) == [photo] and photo.is_symlink()
    assert sha(outside) == outside_sha


def test_upload_copies_the_checked_photo_never_a_symlink_swapped_in_before_the_copy(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an upload worker that checked and hashed the photo and is about to copy it to a local
    # target, the photo's path then swapped for a symlink to an outside JPEG
    job, photo, outside, photo_sha, outside_sha = swap_inside_the_gap("upload", engine, env, fleet, tmp_path)
    # Then (the outside file never read: asserted in swap_inside_the_gap) what was uploaded is the
    # photo that was checked, byte for byte, and nothing of the outside file is in the target
    (item,) = items_of(engine, job)
    assert item.state == "succeeded", item.error
    uploaded = entries(tmp_path / "uploads")
    assert [sha(p) for p in uploaded] == [photo_sha] and not uploaded[0].is_symlink()
    assert sha(outside) == outside_sha


@pytest.mark.parametrize("bundle", ["zip", "tar"])
def test_a_bundle_never_reads_a_member_swapped_for_a_symlink_after_the_check(
    bundle: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an archive worker building a bundle that checked its member, whose path is then swapped
    # for a symlink to an outside JPEG before the bundle is written
    job, photo, outside, _photo_sha, outside_sha = swap_inside_the_gap(
        "archive", engine, env, fleet, tmp_path, extra={"archive.bundle": bundle}
    )  # (the outside file was never read: asserted in swap_inside_the_gap)
    # Then the item fails (the member is opened checked inside the roots) and no bundle was written
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.result
    assert "outside the photo roots" in (item.error or ""), item.error
    assert entries(tmp_path / "archive") == []
    assert photo.is_symlink() and sha(outside) == outside_sha


def test_a_raw_sidecar_shift_never_reads_the_time_of_a_raw_swapped_in_after_the_check(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a raw without a sidecar (taken 2021-07-04 18:30:05) and outside the roots another raw
    # (taken 1999-12-31 23:00:00); an exif worker shifting the raw's time +1h checked the raw, whose
    # path is then swapped for a symlink to the outside raw before its capture time is read
    photos = tmp_path / "photos"
    photos.mkdir()
    raw = make_raw(photos / "DSC_0001.NEF", preview=preview_jpeg())
    outside = make_raw(tmp_path / "outside.NEF", taken="1999:12:31 23:00:00", preview=preview_jpeg())
    outside_sha = sha(outside)
    with reads_of(outside) as reads:
        job = _run_with_swap(
            "exif", engine, env, fleet, tmp_path, "after_check", raw, outside, {"exif.shift": "+1h"}
        )
    # Then the outside raw was never read, the item fails (the raw at the path is not the one whose
    # time was read) and no sidecar was written
    assert reads == [0], f"the exif lane read the outside raw {reads[0]} time(s)"
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.result
    assert "replaced" in (item.error or ""), item.error
    assert entries(photos) == [raw] and raw.is_symlink()
    assert sha(outside) == outside_sha
