"""Which lane waits for which (``store.pipeline.NEEDS``): a failed item skips only the later items
that need it; the photo's backup (upload, archive) goes on with its unedited original. Real store,
SQLite and PostgreSQL (the lock-order checker runs on PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.fencing import fenced
from store.lanes import lane_spec
from store.models import Item
from store.pipeline import blocked_and_next, bundle_members
from tests.support import photo_inputs

SPECS = {name: lane_spec(name, env={}) for name in ("analysis", "exif", "rename", "upload", "archive")}


def _states(engine: Engine, job_id: int) -> dict[tuple[str, int | None], str]:
    with Session(engine) as s:
        rows = s.execute(select(Item.lane, Item.photo_id, Item.state).where(Item.job_id == job_id))
        return {(lane, photo): state for lane, photo, state in rows}


def _item(engine: Engine, job_id: int, lane: str, photo_id: int | None) -> Item:
    with Session(engine) as s:
        return s.execute(
            select(Item).where(Item.job_id == job_id, Item.lane == lane, Item.photo_id == photo_id)
        ).scalar_one()


def _end(engine: Engine, job_id: int, lane: str, photo_id: int | None, *, fail: bool = False) -> None:
    item = _item(engine, job_id, lane, photo_id)
    lease = store_items.claim(engine, SPECS[lane], item.id, item.fencing_token, "w").lease
    assert lease is not None, (lane, photo_id)
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        if fail:
            store_items.fail(s, SPECS[lane], lease, "exiftool refused the file", "w", retry=False)
        else:
            store_items.succeed(s, lease, None, "w")


def _photo_ids(engine: Engine, job_id: int) -> list[int]:
    with Session(engine) as s:
        ids = s.execute(select(Item.photo_id).where(Item.job_id == job_id)).scalars()
        return sorted({p for p in ids if p})


def test_a_failed_edit_skips_the_rename_but_not_the_upload_and_archive(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job exif -> rename -> upload -> archive over one photo
    lanes = ["exif", "rename", "upload", "archive"]
    job = store_jobs.submit(engine, [SPECS[n] for n in lanes], photo_inputs(tmp_path, 1)).job_id
    [photo] = _photo_ids(engine, job)
    # When its exif item fails for good
    _end(engine, job, "exif", photo, fail=True)
    # Then its rename (made from the edited metadata) is skipped, its upload is ready at once
    assert _states(engine, job) == {
        ("exif", photo): "failed", ("rename", photo): "skipped", ("upload", photo): "pending",
        ("archive", photo): "waiting",
    }  # fmt: skip
    # and once uploaded it is archived; the job ends partial
    _end(engine, job, "upload", photo)
    assert _states(engine, job)[("archive", photo)] == "pending"
    _end(engine, job, "archive", photo)
    assert store_jobs.job_status(engine, job).state == "partial"


def test_a_lane_after_a_skipped_one_runs_next_and_a_failed_analysis_stops_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job analysis -> exif -> upload -> rename -> archive over two photos
    lanes = ["analysis", "exif", "upload", "rename", "archive"]
    job = store_jobs.submit(engine, [SPECS[n] for n in lanes], photo_inputs(tmp_path, 2)).job_id
    first, second = _photo_ids(engine, job)
    # When the first photo's analysis fails (nothing decodes it) / Then its exif runs anyway
    _end(engine, job, "analysis", first, fail=True)
    assert _states(engine, job)[("exif", first)] == "pending"
    # When the second's analysis succeeds and its exif fails / Then its upload runs, its rename is
    # skipped, and after the upload the archive (past the skipped rename) is ready
    _end(engine, job, "analysis", second)
    _end(engine, job, "exif", second, fail=True)
    states = _states(engine, job)
    assert (states[("upload", second)], states[("rename", second)]) == ("pending", "skipped")
    _end(engine, job, "upload", second)
    assert _states(engine, job)[("archive", second)] == "pending"


def test_a_bundle_takes_the_photo_whose_edit_failed(engine: Engine, tmp_path: Path) -> None:
    # Given exif -> rename -> archive as one bundle over two photos
    specs = [SPECS["exif"], SPECS["rename"], SPECS["archive"]]
    job = store_jobs.submit(engine, specs, photo_inputs(tmp_path, 2), bundle_lanes=["archive"]).job_id
    edited, refused = _photo_ids(engine, job)
    # When one photo is edited and renamed and the other's edit is refused
    _end(engine, job, "exif", edited)
    _end(engine, job, "exif", refused, fail=True)
    assert _states(engine, job)[("archive", None)] == "waiting"
    _end(engine, job, "rename", edited)
    # Then the bundle is ready and holds both photos (the unedited original too)
    bundle = _item(engine, job, "archive", None)
    assert bundle.state == "pending"
    assert [pid for pid, _ in bundle_members(engine, bundle.id)] == [edited, refused]


def test_blocked_and_next_follows_the_needs_of_each_lane() -> None:
    class Row:
        def __init__(self, position: int, lane: str) -> None:
            self.position, self.lane, self.photo_id, self.id = position, lane, 1, position

    lanes = ["exif", "rename", "upload", "archive"]
    later = [Row(1, "rename"), Row(2, "upload"), Row(3, "archive")]
    skip, ready = blocked_and_next(lanes, "exif", later)
    assert ([r.lane for r in skip], [r.lane for r in ready]) == (["rename"], ["upload"])
    skip, ready = blocked_and_next(["noop", "upload"], "noop", [Row(1, "upload")])
    assert (skip, [r.lane for r in ready]) == ([], ["upload"])
