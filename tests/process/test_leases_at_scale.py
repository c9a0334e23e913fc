"""Healthy workers keep their leases at scale: a 40,000-photo submission on SQLite (200,000 in
``make chaos``), a lane TTL
shorter than the global one, and a bundle of more photos than PostgreSQL takes bind parameters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from store import jobs as store_jobs
from store import submission as store_submission
from store.engine import make_engine
from store.lanes import lane_spec
from store.schema import upgrade
from tests.conftest import _worker_env
from tests.support import Fleet, event_counts, items_of, job_done, make_files, wait_for


# 200,000 photos: 133 s on a quiet machine (2026-12-07), 320 s in the suite (the run's longest test
# by far); its subject is scale, not a hang, so it runs in `make chaos`. 40,000 photos still hold
# the single write lock for ~20 s of chunks (ten 2-s lease TTLs) in `make test`.
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    "count", [40_000, pytest.param(200_000, marks=pytest.mark.slow)], ids=["40k", "200k"]
)
def test_a_long_photo_submission_on_sqlite_costs_no_lease(
    redis_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int
) -> None:
    # Given a SQLite store and a worker holding the lease of a long item (TTL 2 s, beats every 0.5 s)
    url = f"sqlite:///{tmp_path / 'photojobs.db'}"
    engine = make_engine(url)
    upgrade(engine)
    env = _worker_env(url, redis_url)
    (tmp_path / "logs").mkdir()
    fleet = Fleet(env, tmp_path / "logs")
    client = Client(Settings.from_env(env), engine=engine)
    chunk_seconds: list[float] = []
    land = store_submission._land_chunk

    def timed_chunk(*args):  # type: ignore[no-untyped-def]
        t0 = time.perf_counter()
        try:
            return land(*args)
        finally:
            chunk_seconds.append(time.perf_counter() - t0)

    monkeypatch.setattr(store_submission, "_land_chunk", timed_chunk)
    try:
        make_files(tmp_path / "one", 1)
        holder = client.submit(["noop"], [tmp_path / "one"], {"noop.sleep": "3600"}).job_id
        fleet.start_sweeper()
        fleet.start_worker(["noop"], threads=1)
        [running] = wait_for(
            lambda: [i for i in items_of(engine, holder) if i.state == "running"], 90, what="the lease"
        )
        # When 200,000 (40,000) photos are submitted meanwhile (to the rename lane, which no worker
        # here serves)
        photos = [store_jobs.PhotoInput(f"/nowhere/p{i:06d}.jpg", 1) for i in range(count)]
        big = store_jobs.submit(engine, [client.specs["rename"]], photos)
        # Then the worker's lease held all along: same token, still running, no lease_expired anywhere
        [item] = items_of(engine, holder)
        assert item.state == "running" and item.fencing_token == running.fencing_token, fleet.logs()
        assert event_counts(engine, "lease_expired") == {}, fleet.logs()
        assert big.items == count and len(chunk_seconds) > count // store_submission.CHUNK_MAX
        median = sorted(chunk_seconds)[len(chunk_seconds) // 2]
        print(
            f"{count} photos in {len(chunk_seconds)} chunks; chunk transactions (waiting for the lock "
            f"included): longest {max(chunk_seconds) * 1000:.0f} ms, median {median * 1000:.0f} ms"
        )
        # And the held item stops cleanly when its job is cancelled, still without a lost lease
        client.cancel(holder)
        wait_for(lambda: job_done(engine, holder), 60, what="the cancel")
        assert [i.state for i in items_of(engine, holder)] == ["cancelled"]
        assert event_counts(engine, "lease_expired") == {}
    finally:
        fleet.stop()
        engine.dispose()


def test_lane_ttl_shorter_than_the_global_one_loses_no_lease(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a global lease TTL of 10 s, a noop lane TTL of 1 s, and no explicit heartbeat interval
    env.pop("PHOTOJOBS_HEARTBEAT_INTERVAL", None)
    env.update({"PHOTOJOBS_LEASE_TTL": "10", "PHOTOJOBS_LANE_NOOP_LEASE_TTL": "1"})
    make_files(tmp_path / "photos", 4)
    client = Client(Settings.from_env(env))
    # When items of a few seconds each run on a beating worker
    job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "3"}).job_id
    fleet.start_sweeper()
    fleet.start_worker(["noop"], threads=2)
    wait_for(lambda: job_done(engine, job), 120, what="the job")
    # Then every item succeeded on its first attempt: the heartbeat beat for the 1 s lane TTL
    items = items_of(engine, job)
    assert {(i.state, i.attempt) for i in items} == {("succeeded", 1)}, fleet.logs()
    assert event_counts(engine, "lease_expired", job) == {}
    assert event_counts(engine, "stale_commit_rejected", job) == {}
    assert {i.lease_ttl for i in items} == {1.0}
    client.engine.dispose()


def test_bundle_of_more_than_65535_photos_on_postgresql_ends_within_its_attempts(
    pg_url: str, redis_url: str, tmp_path: Path
) -> None:
    # Given a bundle item of 70,000 photos in a lane that locks them exclusively, on PostgreSQL
    env = {**_worker_env(pg_url, redis_url), "PHOTOJOBS_LANE_NOOP_LOCK": "X"}
    (tmp_path / "logs").mkdir()
    fleet = Fleet(env, tmp_path / "logs")
    engine = make_engine(pg_url)
    try:
        spec = lane_spec("noop", env)
        photos = [store_jobs.PhotoInput(f"/nowhere/b{i:06d}.jpg", 1) for i in range(70_000)]
        job = store_jobs.submit(engine, [spec], photos, bundle_lanes=["noop"]).job_id
        # When a worker and a sweeper take it
        fleet.start_sweeper()
        fleet.start_worker(["noop"], threads=1)
        # Then it ends — succeeded, or failed within its 3 attempts — instead of coming back forever
        wait_for(lambda: job_done(engine, job), 600, interval=0.5, what="the bundle to end")
        [item] = items_of(engine, job)
        assert item.attempt <= 3, fleet.logs()
        assert item.state == "succeeded", (item.state, item.error, fleet.logs())
        assert sum(event_counts(engine, "item_claimed", job).values()) == item.attempt
    finally:
        fleet.stop()
        engine.dispose()
