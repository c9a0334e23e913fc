"""Exactly-once file effects with real workers: SIGKILL at every step boundary, frozen zombies."""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exif import read_metadata
from photos.fileops import sha256_file
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from store.models import Photo
from tests.support import Fleet, event_counts, events_of, items_of, job_done, wait_for

BOUNDARIES = ["after_stage", "after_record", "after_apply", "after_mark"]
LANES = ["exif", "rename", "archive", "upload"]
PARAMS = {
    "exif": {"exif.shift": "+1h", "exif.rating": "4"},
    "rename": {"rename.pattern": "{taken:%Y-%m-%d_%H%M%S}_{camera}{ext}"},
    "archive": {},
    "upload": {},
}


def sample_photos(folder: Path, n: int = 3) -> dict[str, tuple[str, str | None]]:
    """{name: (sha256, DateTimeOriginal)} of freshly generated photos."""
    made = generate_samples(folder, n, seed=11, size=(320, 240))
    return {p.name: (sha256_file(p), read_metadata(p).get("taken")) for p in made}


def temp_files(*roots: Path) -> list[Path]:
    return [p for r in roots if r.exists() for p in r.rglob("*.tmp")]


def all_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and HISTORY not in p.parts] if root.exists() else []


def store_paths_match_disk(
    engine: Engine, deleted: frozenset[str] = frozenset(), under: Path | None = None
) -> None:
    """Every photo the store knows is on disk where the store says (but those the test deleted);
    with ``under``, every photo the store has there (a store shared by a module's tests)."""
    with Session(engine) as s:
        for photo in s.execute(select(Photo)).scalars():
            elsewhere = under is not None and not Path(photo.path).is_relative_to(under)
            if elsewhere or Path(photo.path).name in deleted:
                continue
            assert Path(photo.path).is_file(), (
                f"store says photo {photo.id} is at {photo.path}, disk disagrees"
            )


def check_outcome(lane: str, folder: Path, before: dict[str, tuple[str, str | None]], engine: Engine) -> None:
    """Every photo exists exactly once, at the right path, with the right bytes; no temp files."""
    archive, uploads = Path(f"{folder}-archive"), Path(f"{folder}-uploads")
    assert temp_files(folder, archive, uploads) == []
    store_paths_match_disk(engine)
    if lane == "exif":
        files = all_files(folder)
        assert len(files) == len(before)
        for f in files:
            meta = read_metadata(f)
            assert meta["rating"] == 4
            original = datetime.fromisoformat(before[f.name][1])  # type: ignore[arg-type]
            assert datetime.fromisoformat(meta["taken"]) == original + timedelta(hours=1), (
                "shift applied once"
            )
    elif lane in ("rename", "archive"):
        where = folder if lane == "rename" else archive
        hashes = sorted(sha256_file(f) for f in all_files(where))
        assert hashes == sorted(h for h, _ in before.values()), "each photo exactly once, bytes unchanged"
        if lane == "archive":
            assert all_files(folder) == []
    else:
        assert sorted(sha256_file(f) for f in all_files(uploads)) == sorted(h for h, _ in before.values())
        assert sorted(sha256_file(f) for f in all_files(folder)) == sorted(h for h, _ in before.values())


@pytest.mark.parametrize("lane", LANES)
def test_worker_killed_at_each_step_boundary_recovers_exactly_once(
    lane: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given photos of their own and a job over them for each step boundary of the lane, and items
    # that may be killed more than once (up to one death per boundary) before they are quarantined
    env["PHOTOJOBS_MAX_ATTEMPTS"] = "10"  # the fleet's processes read this dict
    client = Client(Settings.from_env(env))
    rounds = []
    for boundary in BOUNDARIES:
        folder = tmp_path / boundary / "photos"
        before = sample_photos(folder)
        rounds.append((folder, before, client.submit([lane], [folder], PARAMS[lane]).job_id))
    fleet.start_sweeper()
    # When, one boundary after another, a worker dies (SIGKILL) at that boundary of the lane (each
    # in whichever item it took: a fresh one, or one a worker before it died in)
    for boundary in BOUNDARIES:
        doomed = fleet.start_worker([lane], threads=1, env={"PHOTOJOBS_FAILPOINTS": f"{lane}.{boundary}"})
        wait_for(lambda p=doomed: p.poll() is not None, 60, what=f"the worker to die at {lane}.{boundary}")
    # And then a healthy worker takes over
    fleet.start_worker([lane], threads=2)
    jobs = [job for *_, job in rounds]
    wait_for(lambda: all(job_done(engine, job) for job in jobs), 120, what="the jobs to finish")
    # Then every item of every job succeeded once and every photo is where it should be, exactly once
    expired = {job: sorted(event_counts(engine, "lease_expired", job)) for job in jobs}
    for folder, before, job in rounds:
        where = f"{lane} job {job} over {folder} (the workers died at {BOUNDARIES}; items expired: {expired})"
        assert {i.state for i in items_of(engine, job)} == {"succeeded"}, where
        assert set(event_counts(engine, "item_succeeded", job).values()) == {1}, where
        check_outcome(lane, folder, before, engine)
    client.engine.dispose()


@pytest.mark.parametrize("lane", ["exif", "rename"])
@pytest.mark.parametrize("boundary", ["after_stage", "after_record"])
def test_frozen_worker_is_overtaken_and_its_effect_never_lands_twice(
    lane: str, boundary: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a worker that freezes itself (SIGSTOP) at a step boundary
    folder = tmp_path / "photos"
    before = sample_photos(folder, 1)
    client = Client(Settings.from_env(env))
    job = client.submit([lane], [folder], PARAMS[lane]).job_id
    fleet.start_sweeper()
    zombie = fleet.start_worker([lane], threads=1, env={"PHOTOJOBS_FAILPOINTS": f"{lane}.{boundary}:stop"})
    item = wait_for(lambda: items_of(engine, job)[0].lease_owner and items_of(engine, job)[0], 60)
    wait_for(
        lambda: Path(f"/proc/{int(item.lease_owner.split(':')[1])}/stat").read_text().split()[2] == "T",
        60,
        what="the worker to freeze",
    )
    # When its lease expires and another worker completes the item, and then the zombie resumes
    fleet.start_worker([lane], threads=1)
    wait_for(lambda: job_done(engine, job), 90, what="the winner to finish")
    os.killpg(zombie.pid, signal.SIGCONT)

    zombie_refused = lambda: events_of(engine, "stale_commit_rejected", worker=item.lease_owner)  # noqa: E731
    wait_for(zombie_refused, 60, what="the zombie's commit to be refused")
    # Then the winner's effect is there exactly once and the zombie's never landed on top of it
    assert items_of(engine, job)[0].state == "succeeded"
    check_outcome(lane, folder, before, engine)
    client.engine.dispose()
