"""A bundle of more photos than a statement may have bind parameters (PostgreSQL 65,535, SQLite
32,766) is claimed, locked and finished: the lock statements and IN lists go in chunks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.fencing import fenced
from store.lanes import EXCLUSIVE, lane_spec
from store.models import PhotoLock

PHOTOS = 70_000
LOCKING = replace(lane_spec("noop", env={}), lock=EXCLUSIVE)


def test_bundle_of_70000_photos_is_claimed_and_finished(engine: Engine, tmp_path: Path) -> None:
    # Given one bundle item naming 70,000 photos in a lane that locks them exclusively
    inputs = [store_jobs.PhotoInput(str(tmp_path / f"p{i:06d}.jpg"), 1) for i in range(PHOTOS)]
    job = store_jobs.submit(engine, [LOCKING], inputs, bundle_lanes=["noop"]).job_id
    [pub] = take_for_dispatch(engine, LOCKING)
    # When it is claimed
    outcome = store_items.claim(engine, LOCKING, pub.item_id, pub.token, "w")
    # Then the claim holds a lock on every photo
    assert outcome.lease is not None, outcome.reason
    assert len(outcome.lease.photo_ids) == PHOTOS
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(PhotoLock)).scalar_one() == PHOTOS
    # When it succeeds
    with fenced(engine, outcome.lease.item_id, outcome.lease.token, worker="w") as s:
        store_items.succeed(s, outcome.lease, {"ok": True}, "w")
    # Then the job succeeded and the locks are gone
    assert store_jobs.job_status(engine, job).state == "succeeded"
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(PhotoLock)).scalar_one() == 0
