"""Retry and retention in the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store.events import read_events
from store.lanes import all_lanes
from store.models import Item, Job
from store.retention import prune
from store.retry import NothingToRetry, retry


def _submit(engine: Engine, lanes: list[str], n: int, tmp: Path) -> int:
    specs = all_lanes({})
    photos = [store_jobs.PhotoInput(str(tmp / f"p{i}.jpg")) for i in range(n)]
    return store_jobs.submit(engine, [specs[x] for x in lanes], photos).job_id


def _set(
    engine: Engine, job: int, lane: str, state: str, error: str | None = None, ids: list[int] | None = None
) -> None:
    with Session(engine) as s, s.begin():
        q = update(Item).where(Item.job_id == job, Item.lane == lane)
        if ids is not None:
            q = q.where(Item.photo_id.in_(ids))
        s.execute(q.values(state=state, error=error, attempt=3))


def _states(engine: Engine, job: int) -> dict[tuple[int | None, str], str]:
    with Session(engine) as s:
        rows = s.execute(select(Item.photo_id, Item.lane, Item.state).where(Item.job_id == job)).all()
    return {(r.photo_id, r.lane): r.state for r in rows}


def test_retry_puts_failed_items_and_the_lanes_they_held_up_back(engine: Engine, tmp_path: Path) -> None:
    # Given a two-lane job: photo 1 failed analysis (its exif skipped), photo 2 went through
    job = _submit(engine, ["analysis", "exif"], 2, tmp_path)
    with Session(engine) as s:
        p1, p2 = sorted(s.execute(select(Item.photo_id).where(Item.job_id == job).distinct()).scalars())
    _set(engine, job, "analysis", "succeeded", ids=[p2])
    _set(engine, job, "exif", "succeeded", ids=[p2])
    _set(engine, job, "analysis", "failed", "boom", ids=[p1])
    _set(engine, job, "exif", "skipped", "analysis failed: boom", ids=[p1])
    # When the job is retried
    changed = retry(engine, job)
    # Then the failed item is pending with fresh attempts, its later lane waits, the rest is untouched
    assert changed == 2
    assert _states(engine, job) == {
        (p1, "analysis"): "pending",
        (p1, "exif"): "waiting",
        (p2, "analysis"): "succeeded",
        (p2, "exif"): "succeeded",
    }
    with Session(engine) as s:
        retried = s.execute(
            select(Item).where(Item.job_id == job, Item.photo_id == p1, Item.lane == "analysis")
        ).scalar_one()
        assert retried.attempt == 0 and retried.error is None
    types = [e.type for e in read_events(engine, job_id=job)]
    assert types.count("item_retried") == 2 and types[-1] == "job_retried"
    # And retrying again has nothing to do
    with pytest.raises(NothingToRetry):
        retry(engine, job)


def test_retry_of_one_lane_and_of_a_cancelled_job(engine: Engine, tmp_path: Path) -> None:
    # Given a cancelled two-lane job whose analysis succeeded and exif was cancelled
    job = _submit(engine, ["analysis", "exif"], 2, tmp_path)
    store_jobs.cancel(engine, job)
    _set(engine, job, "analysis", "succeeded")
    # When only the exif lane is retried (analysis has nothing to retry)
    with pytest.raises(NothingToRetry):
        retry(engine, job, "analysis")
    changed = retry(engine, job, "exif")
    # Then exif items are pending and the cancel request is lifted
    assert changed == 2
    assert set(_states(engine, job).values()) == {"succeeded", "pending"}
    with Session(engine) as s:
        assert s.get(Job, job).control is None  # type: ignore[union-attr]
    assert store_jobs.job_status(engine, job).state == "running"


def test_prune_removes_finished_jobs_and_old_events_but_keeps_cursors_going(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a finished old job, an unfinished job and a finished newest job
    done = _submit(engine, ["analysis"], 2, tmp_path / "a")
    _set(engine, done, "analysis", "succeeded")
    active = _submit(engine, ["analysis"], 2, tmp_path / "b")
    newest = _submit(engine, ["analysis"], 1, tmp_path / "c")
    _set(engine, newest, "analysis", "failed", "x")
    last = read_events(engine)[-1].cursor
    # When everything older than 0 s is pruned
    result = prune(engine, 0)
    # Then only the finished old job goes; all events but the newest go; the next event continues the cursor
    assert (result.jobs, result.items) == (1, 2)
    with Session(engine) as s:
        assert sorted(s.execute(select(Job.id)).scalars()) == [active, newest]
    assert [e.cursor for e in read_events(engine)] == [last]
    again = _submit(engine, ["analysis"], 1, tmp_path / "d")
    assert again > newest
    assert read_events(engine)[1].cursor == last + 1
    # And pruning with a long age keeps everything
    assert prune(engine, 3600).events == 0
