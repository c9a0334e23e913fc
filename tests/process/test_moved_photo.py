"""A moved photo the store must not lose (issue 22): a rename or archive move that landed, its
worker SIGKILLed before marking it, the moved file then edited by another program (exiftool).
Whoever settles the intent (the item's next attempt, or the sweeper after a cancel) fails the item
with the conflict and moves the photo row to where the photo is, so later jobs find it and a new
submission of its path reuses the row. Real workers, Redis, exiftool, both stores."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exif import read_metadata
from photos.fileops import sha256_file
from store.models import Intent, Photo, PhotoLock
from tests.support import Fleet, items_of, job_done, unavailable, wait_for

PARAMS = {
    "rename": {"rename.pattern": "moved_{taken:%Y%m%d_%H%M%S}{ext}"},
    "archive": {},
}


def photo_rows(engine: Engine) -> list[Photo]:
    with Session(engine) as s:
        return list(s.execute(select(Photo).order_by(Photo.id)).scalars())


def the_intent(engine: Engine) -> Intent:
    with Session(engine) as s:
        (intent,) = s.execute(select(Intent)).scalars().all()
        return intent


def edit_outside(photo: Path) -> None:
    """Another program edits the photo: exiftool writes a new file and renames it into place."""
    try:
        subprocess.run(
            ["exiftool", "-q", "-overwrite_original", "-Rating=3", str(photo)], check=True, timeout=60
        )
    except FileNotFoundError:
        unavailable("exiftool is not installed")


def move_lands_then_worker_dies(
    lane: str, engine: Engine, env: dict[str, str], fleet: Fleet, folder: Path, boundary: str = "after_apply"
) -> tuple[Client, int, Path, Path]:
    """Submit a ``lane`` job for one photo; its worker SIGKILLs itself right after the move landed
    (``after_apply``: the old name dropped; ``after_move``: before dropping it). Returns the client,
    the job, the photo's old path and the path it was moved to."""
    (photo,) = generate_samples(folder, 1, seed=31, size=(320, 240))
    client = Client(Settings.from_env(env))
    job = client.submit([lane], [folder], PARAMS[lane]).job_id
    fleet.start_sweeper()
    doomed = fleet.start_worker([lane], threads=1, env={"PHOTOJOBS_FAILPOINTS": f"{lane}.{boundary}"})
    wait_for(lambda: doomed.poll() is not None, 90, what=f"the {lane} worker to die at {boundary}")
    moved = Path(the_intent(engine).target)
    assert moved.is_file(), "the move landed before the worker died"
    assert photo.exists() == (boundary == "after_move"), "the old name was dropped after the move only"
    assert [p.path for p in photo_rows(engine)] == [str(photo)], "the move was never marked"
    return client, job, photo, moved


def photo_row_follows_the_file(engine: Engine, moved: Path) -> int:
    """One photo row, naming where the photo is, with the content it has there; returns its id."""
    (row,) = photo_rows(engine)
    assert row.path == str(moved), f"the store says {row.path}, the photo is at {moved}"
    assert row.sha256 == sha256_file(moved), "the store's content hash is the moved file's"
    with Session(engine) as s:
        assert [i.state for i in s.execute(select(Intent)).scalars()] == ["applied"]
        assert s.execute(select(PhotoLock)).all() == []
    return row.id


def a_later_job_finds_the_same_photo(
    client: Client, engine: Engine, fleet: Fleet, moved: Path, photo_id: int
) -> None:
    """Submitting the new path reuses the photo row, and an EXIF job on it succeeds."""
    later = client.submit(["exif"], [moved], {"exif.rating": "5"}).job_id
    (item,) = items_of(engine, later)
    assert item.photo_id == photo_id, "the new path's submission found the same photo row"
    assert [p.id for p in photo_rows(engine)] == [photo_id], "no second photo row"
    fleet.start_worker(["exif"], threads=1)
    wait_for(lambda: job_done(engine, later), 90, what="the later exif job")
    (item,) = items_of(engine, later)
    assert item.state == "succeeded", item.error
    assert read_metadata(moved)["rating"] == 5
    (row,) = photo_rows(engine)
    assert row.path == str(moved)


@pytest.mark.parametrize("boundary", ["after_apply", "after_move"])
@pytest.mark.parametrize("lane", ["rename", "archive"])
def test_move_landed_then_edited_outside_recovery_fails_item_and_photo_row_follows_the_file(
    lane: str, boundary: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a rename/archive whose worker was SIGKILLed right after its move landed (after_move:
    # before it dropped the photo's old name)
    folder = tmp_path / "photos"
    client, job, photo, moved = move_lands_then_worker_dies(lane, engine, env, fleet, folder, boundary)
    original = photo.read_bytes() if photo.exists() else None
    # And another program edits the moved photo before the item is retried
    edit_outside(moved)
    assert read_metadata(moved)["rating"] == 3
    # When a healthy worker takes the item over (the next attempt recovers the intent)
    fleet.start_worker([lane], threads=1)
    wait_for(lambda: job_done(engine, job), 120, what=f"the {lane} job to end")
    # Then the item failed with the conflict, naming where the photo is now …
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.error
    assert "changed by someone else" in (item.error or "") and str(moved) in (item.error or "")
    # … the photo was not touched (an old name left by the dead attempt keeps its bytes, and is
    # not moved again), and the store follows the photo there
    assert read_metadata(moved)["rating"] == 3
    if boundary == "after_move":
        assert photo.read_bytes() == original and str(photo) in (item.error or "")
    else:
        assert not photo.exists()
    photo_id = photo_row_follows_the_file(engine, moved)
    # And a later job on the photo works, on the same photo row
    a_later_job_finds_the_same_photo(client, engine, fleet, moved, photo_id)
    client.engine.dispose()


@pytest.mark.parametrize("lane", ["rename", "archive"])
def test_move_landed_then_edited_outside_then_cancelled_sweeper_moves_photo_row_to_the_file(
    lane: str, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a rename/archive whose worker was SIGKILLed right after its move landed
    client, job, photo, moved = move_lands_then_worker_dies(lane, engine, env, fleet, tmp_path / "photos")
    # And another program edits the moved photo
    edit_outside(moved)
    # When the job is cancelled instead of retried (the sweeper settles the orphaned intent)
    client.cancel(job)
    wait_for(lambda: job_done(engine, job), 90, what="the job to end")

    def settled() -> bool:
        with Session(engine) as s:
            return not s.execute(select(Intent).where(Intent.state == "recorded")).all()

    wait_for(settled, 90, what="the sweeper to settle the orphaned intent")
    # Then the item is cancelled, the photo untouched, and the store follows it to where it is
    assert [i.state for i in items_of(engine, job)] == ["cancelled"]
    assert read_metadata(moved)["rating"] == 3 and not photo.exists()
    photo_id = photo_row_follows_the_file(engine, moved)
    # And a later job on the photo works, on the same photo row
    a_later_job_finds_the_same_photo(client, engine, fleet, moved, photo_id)
    client.engine.dispose()
