"""Issue 41: a job's ETA from the work it has left (``store.eta``), not from the lanes' recent rates.

Per lane: remaining items × the lane's measured busy time per item (the run times of the job's own
attempts) ÷ the threads the live fleet gives it; along the pipeline's dependencies (rename after
exif); and no sooner than all the work left over every thread serving the job. Shown from 10 % of
the job's items. The arithmetic alone (``estimate``), then on a real store (both), a real 3-lane job
whose lanes run at different speeds, the workers registered as a fleet registers them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.cli import cli
from store import console, workers
from store import items as store_items
from store import jobs as store_jobs
from store.eta import LaneWork, estimate
from store.fencing import fenced
from store.lanes import all_lanes
from store.models import Event, Item

SPECS = all_lanes({})
LANES = ("analysis", "exif", "rename")
RUN_TIME = {"analysis": 0.2, "exif": 1.0, "rename": 0.5}  # seconds per item, as measured


def test_the_arithmetic_sums_along_the_dependencies_and_shares_the_fleets_threads() -> None:
    """Given a 3-lane job: analysis 100 left at 0.1 s on 2 threads, exif 40 at 0.5 s on 4, rename
    40 at 0.25 s on 4 (rename needs exif)
    When the fleet has 4 threads in all, then 16
    Then with 4 the shared threads bound it: (10 + 20 + 10) thread-seconds ÷ 4 = 10 s; with 16 the
    chain does: exif's 5 s then one rename item, 5.25 s (analysis's 5 s runs beside it); a lane
    not measured, or with no thread, gives no ETA; nothing left is 0."""
    lanes = {
        "analysis": LaneWork(100, 0.1, 2),
        "exif": LaneWork(40, 0.5, 4),
        "rename": LaneWork(40, 0.25, 4),
    }
    assert estimate(lanes, LANES, 4) == pytest.approx(10.0)
    assert estimate(lanes, LANES, 16) == pytest.approx(5.25)
    assert estimate({**lanes, "rename": LaneWork(40, None, 4)}, LANES, 16) is None
    assert estimate({**lanes, "exif": LaneWork(40, 0.5, 0)}, LANES, 16) is None
    assert estimate({lane: LaneWork(0, None, 0) for lane in LANES}, LANES, 16) == 0.0


def _finish(engine: Engine, item_id: int, run: float) -> None:
    """Claim and succeed one item for real, then record that its run took ``run`` seconds (the
    finish event's ``claimed_at``, which the run-time histogram and the ETA read)."""
    with Session(engine) as s:
        item = s.get(Item, item_id)
        assert item is not None
        lane, token = item.lane, item.fencing_token
    lease = store_items.claim(engine, SPECS[lane], item_id, token, "host:1:w").lease
    assert lease is not None, item_id
    with fenced(engine, item_id, lease.token) as s:
        store_items.succeed(s, lease, None, "host:1:w")
    with Session(engine) as s, s.begin():
        event = s.execute(
            select(Event).where(Event.item_id == item_id, Event.type == "item_succeeded")
        ).scalar_one()
        event.detail = {**(event.detail or {}), "claimed_at": event.at - run}


def _items(engine: Engine, job: int, lane: str) -> list[int]:
    with Session(engine) as s:
        return list(
            s.execute(
                select(Item.id).where(Item.job_id == job, Item.lane == lane).order_by(Item.id)
            ).scalars()
        )


@pytest.fixture
def job(engine: Engine, tmp_path: Path) -> Iterator[int]:
    """A 10-photo analysis → exif → rename job: 4 analysis items done at 0.2 s each, 4 exif at
    1.0 s, 3 renames at 0.5 s (11 of 30 items settled, over 10 %)."""
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg")) for i in range(10)]
    job_id = store_jobs.submit(engine, [SPECS[lane] for lane in LANES], photos).job_id
    for lane, n in (("analysis", 4), ("exif", 4), ("rename", 3)):
        for item_id in _items(engine, job_id, lane)[:n]:
            _finish(engine, item_id, RUN_TIME[lane])
    yield job_id


def _register(engine: Engine, n: int) -> None:
    for k in range(n):
        workers.beat(engine, f"host:{100 + k}:w", lanes=list(LANES), interval=60.0, held=0, threads=4)


def test_a_3_lane_job_with_lanes_of_different_speeds_gets_its_eta_from_the_work_left(
    engine: Engine, job: int
) -> None:
    """Given the job (left: analysis 6 at 0.2 s, exif 6 at 1.0 s, rename 7 at 0.5 s) and one live
    worker of 4 threads serving the three lanes (analysis's own limit: 2)
    When its times are read
    Then each lane's part is measured (per item, concurrency) and the ETA is the shared threads'
    bound: (1.2 + 6 + 3.5) ÷ 4 = 2.675 s. With three such workers (12 threads) it is the chain's:
    exif's 6 × 1.0 ÷ 12 = 0.5 s, then one rename item, 1.0 s — the same job, the fleet counted."""
    st = store_jobs.job_status(engine, job)
    assert console.job_times(engine, st).eta is None  # no live worker: no ETA, not a guess
    _register(engine, 1)
    times = console.job_times(engine, st)
    assert times.work == {
        "analysis": {"remaining": 6, "per_item": pytest.approx(0.2, abs=1e-3), "concurrency": 2},
        "exif": {"remaining": 6, "per_item": pytest.approx(1.0, abs=1e-3), "concurrency": 4},
        "rename": {"remaining": 7, "per_item": pytest.approx(0.5, abs=1e-3), "concurrency": 4},
    }
    assert times.eta == pytest.approx(2.675, abs=0.01)
    _register(engine, 3)
    assert console.job_times(engine, st).eta == pytest.approx(1.0, abs=0.01)


def test_no_eta_before_a_tenth_of_the_items_is_settled(engine: Engine, tmp_path: Path) -> None:
    """Given a 3-lane job of 10 photos with 2 of its 30 items done (under 10 %) and a live worker
    When its times are read
    Then the ETA is None (measuring), though a lane has run times."""
    photos = [store_jobs.PhotoInput(str(tmp_path / f"q{i}.jpg")) for i in range(10)]
    job_id = store_jobs.submit(engine, [SPECS[lane] for lane in LANES], photos).job_id
    for item_id in _items(engine, job_id, "analysis")[:2]:
        _finish(engine, item_id, 0.2)
    _register(engine, 1)
    assert console.job_times(engine, store_jobs.job_status(engine, job_id)).eta is None


def test_status_prints_the_eta_and_its_json_carries_times(engine: Engine, redis_url: str, job: int) -> None:
    """Given the job and one live worker
    When ``photojobs status J``, ``status J --json``, ``jobs`` and ``jobs --json`` are run
    Then the text says ``ETA 3s (from the work left)`` and never ``None``; the JSON's ``times``
    carries the ETA and each lane's part; the jobs list shows the ETA (text and JSON)."""
    _register(engine, 1)
    url = engine.url.render_as_string(hide_password=False)
    env = {"PHOTOJOBS_DATABASE_URL": url, "PHOTOJOBS_REDIS_URL": redis_url}
    runner = CliRunner()
    text = runner.invoke(cli, ["status", str(job)], env=env)
    assert text.exit_code == 0, text.output
    assert "ETA 3s (from the work left)" in text.output
    assert "None" not in text.output
    out = runner.invoke(cli, ["status", str(job), "--json"], env=env)
    assert out.exit_code == 0, out.output
    times = json.loads(out.output)["times"]
    assert times["eta"] == pytest.approx(2.675, abs=0.01)
    assert times["work"]["exif"]["concurrency"] == 4
    listed = runner.invoke(cli, ["jobs"], env=env)
    assert listed.exit_code == 0, listed.output
    assert ", ETA 3s" in listed.output and "None" not in listed.output
    row = json.loads(runner.invoke(cli, ["jobs", "--json"], env=env).output)["jobs"][0]
    assert row["job"] == job and row["eta"] == pytest.approx(2.675, abs=0.01)
