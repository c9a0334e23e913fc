"""Typed, bounded lanes and ordered photo locks with real workers (SQLite and PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.broker import RedisPublisher, build_broker
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from store.lanes import all_lanes
from store.models import Event
from tests.support import ROOT, Fleet, item_states, job_done, make_files, wait_for

ENDS = {
    "item_succeeded",
    "item_failed",
    "item_cancelled",
    "item_paused",
    "item_released",
    "lease_expired",
    "item_retry_scheduled",
}
EXCLUSIVE = {"exif", "rename", "archive"}


def work_intervals(engine: Engine) -> dict[int, list[tuple[float, float, str, int]]]:
    """Per photo: (claimed at, ended at, lane, item) of every finished piece of work, from the event log."""
    with Session(engine) as s:
        events = s.execute(select(Event).where(Event.item_id.is_not(None)).order_by(Event.id)).scalars().all()
    open_: dict[tuple[int, int], Event] = {}
    out: dict[int, list[tuple[float, float, str, int]]] = defaultdict(list)
    for e in events:
        if e.type == "item_claimed":
            open_[(e.item_id, e.token)] = e  # type: ignore[index]
        elif e.type in ENDS:
            token = e.detail["old_token"] if e.type == "lease_expired" else e.token  # type: ignore[index]
            start = open_.pop((e.item_id, token), None)  # type: ignore[arg-type]
            if start is not None:
                out[e.photo_id].append((start.at, e.at, e.lane, e.item_id))  # type: ignore[index, arg-type]
    return out


def test_exclusive_work_never_overlaps_other_work_on_a_photo(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given 200 photos and three concurrent jobs on them: two analysis jobs (shared) and an exif job
    folder = tmp_path / "photos"
    generate_samples(folder, 200, seed=9, size=(800, 600))
    client = Client(Settings.from_env(env))
    first = client.submit(["analysis"], [folder], {"analysis.dup_distance": "5"}).job_id
    exif = client.submit(["exif"], [folder], {"exif.rating": "3"}).job_id
    second = client.submit(["analysis"], [folder], {"analysis.dup_distance": "6"}).job_id
    # When they run at once on three workers
    fleet.start_sweeper()
    for _ in range(3):
        fleet.start_worker(["analysis", "exif"], threads=3)
    for job in (first, exif, second):
        wait_for(lambda job=job: job_done(engine, job), 300, what=f"job {job} to finish")
    # Then no exclusive (exif) interval overlaps any other work on the same photo
    intervals = work_intervals(engine)
    assert len(intervals) == 200
    shared_overlaps = 0
    for photo, spans in intervals.items():
        for i, (a0, a1, lane_a, item_a) in enumerate(spans):
            for b0, b1, lane_b, item_b in spans[i + 1 :]:
                overlap = a0 < b1 and b0 < a1
                if overlap and (lane_a in EXCLUSIVE or lane_b in EXCLUSIVE):
                    raise AssertionError(
                        f"photo {photo}: {lane_a} item {item_a} overlaps {lane_b} item {item_b}"
                    )
                shared_overlaps += overlap
    # And shared work did overlap: the lock is not a global mutex
    assert shared_overlaps > 0
    for job in (first, exif, second):
        assert item_states(engine, job) == {"succeeded": 200}
    client.engine.dispose()


def test_redis_holds_at_most_the_bound_for_a_20k_job_and_cancel_needs_no_drain(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 20,000-item noop job and a lane bound of 32 (make test; the 100,000-item job on SQLite
    # is the slow twin below)
    redis_holds_the_bound_and_cancel_needs_no_drain(20_000, engine, env, fleet, tmp_path)


@pytest.mark.slow  # make chaos (its 20,000-item twin runs in make test)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_redis_holds_at_most_the_bound_for_a_100k_job_and_cancel_needs_no_drain(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 100,000-item noop job on SQLite and a lane bound of 32
    redis_holds_the_bound_and_cancel_needs_no_drain(100_000, engine, env, fleet, tmp_path)


def redis_holds_the_bound_and_cancel_needs_no_drain(
    n: int, engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    make_files(tmp_path / "photos", n)
    env = {**env, "PHOTOJOBS_LANE_NOOP_BOUND": "32"}
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "0.01"}).job_id
    publisher = RedisPublisher(build_broker(env["PHOTOJOBS_REDIS_URL"]), all_lanes(env))
    fleet.env = env
    fleet.start_sweeper()
    fleet.start_worker(threads=4)
    fleet.start_worker(threads=4)
    # When it runs for a while, Redis sampled all along
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.02):
            samples.append(publisher.queue_length("noop"))

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        wait_for(lambda: item_states(engine, job).get("succeeded", 0) >= 300, 120, what="300 items done")
    finally:
        stop.set()
        sampler.join()
    # Then Redis never held more than the bound, while more than half the job waited in the store
    assert samples and max(samples) <= 32, max(samples)
    assert item_states(engine, job).get("pending", 0) > n // 2
    # And a cancel is immediate: every item ends terminal without draining Redis
    client.cancel(job)
    wait_for(lambda: "running" not in item_states(engine, job), 60, what="running items to stop")
    assert set(item_states(engine, job)) <= {"succeeded", "cancelled"}
    client.engine.dispose()


def test_submission_past_the_backlog_bound_is_refused_with_exit_75(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given a noop lane whose backlog bound is 10
    make_files(tmp_path / "photos", 11)
    env = {**env, "PHOTOJOBS_LANE_NOOP_BACKLOG": "10"}
    # When 11 photos are submitted through the CLI
    cmd = [sys.executable, "-m", "photojobs", "submit", "--lanes", "noop", str(tmp_path / "photos")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    # Then it exits 75 (EX_TEMPFAIL) naming the lane, the backlog and the bound; nothing was written
    assert done.returncode == 75, done.stderr
    assert "'noop' is full" in done.stderr and "bound of 10" in done.stderr
    status = subprocess.run(
        [sys.executable, "-m", "photojobs", "status"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "no jobs yet" in status.stderr
