"""Pausing a lane across all jobs with real workers (SQLite and PostgreSQL): its queued work is not
started while other lanes go on, the pause survives worker and web restarts, a resume finishes
everything exactly once."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from tests.support import (
    Fleet,
    event_counts,
    events_of,
    item_states,
    items_of,
    make_files,
    wait_for,
    wait_job_done,
)
from tests.web_support import WebServer


def _queued_everything(engine: Engine, job: int, n: int) -> bool:
    return item_states(engine, job).get("queued", 0) == n


def _refused_everything(engine: Engine, job: int) -> bool:
    """Every item of the job is back to pending (its message was taken and refused)."""
    return set(item_states(engine, job)) == {"pending"}


def _lane_deferrals(engine: Engine, job: int) -> int:
    return sum(
        1
        for e in events_of(engine, "item_deferred")
        if e.job_id == job and (e.detail or {}).get("reason") == "lane paused"
    )


def _each_succeeded_once(engine: Engine, job: int) -> None:
    items = items_of(engine, job)
    assert {i.state for i in items} == {"succeeded"}
    succeeded = event_counts(engine, "item_succeeded", job)
    assert succeeded == {i.id: 1 for i in items}


def test_a_paused_lane_starts_nothing_while_another_lane_goes_on_and_resume_finishes_it_once(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an analysis job whose 12 items are all queued in Redis (a sweeper dispatched them, no worker yet)
    generate_samples(tmp_path / "photos", 12, seed=3, size=(320, 240))
    make_files(tmp_path / "files", 16)
    client = Client(Settings.from_env(env))
    analysis = client.submit(["analysis"], [tmp_path / "photos"]).job_id
    fleet.start_sweeper()
    wait_for(lambda: _queued_everything(engine, analysis, 12), 60, what="the analysis items queued")
    # When the analysis lane is paused, then workers for both lanes start and a noop job is submitted
    assert client.pause_lane("analysis", by="test") is True
    fleet.start_worker(["analysis", "noop"], threads=2)
    fleet.start_worker(["analysis", "noop"], threads=2)
    noop = client.submit(["noop"], [tmp_path / "files"], {"noop.sleep": "0.05"}).job_id
    # Then the noop lane finishes its job
    wait_job_done(engine, noop, 120)
    _each_succeeded_once(engine, noop)
    # And every queued analysis message was taken and refused quietly: its item back to pending, none started
    wait_for(lambda: _refused_everything(engine, analysis), 60, what="the analysis items refused")
    assert _lane_deferrals(engine, analysis) >= 12
    assert not [e for e in events_of(engine, "item_claimed") if e.job_id == analysis]
    assert [entry["lane"] for entry in client.lanes() if entry["paused"]] == ["analysis"]
    # When the lane is resumed
    assert client.resume_lane("analysis", by="test") is True
    # Then the analysis job finishes, each item exactly once
    wait_job_done(engine, analysis, 120)
    _each_succeeded_once(engine, analysis)
    assert [e.lane for e in events_of(engine, "lane_paused")] == ["analysis"]
    assert [e.lane for e in events_of(engine, "lane_resumed")] == ["analysis"]
    client.engine.dispose()


def test_a_lane_paused_through_the_web_stays_paused_across_worker_and_web_restarts(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given the web API and a fleet serving the noop and analysis lanes
    make_files(tmp_path / "files", 10)
    generate_samples(tmp_path / "photos", 4, seed=5, size=(320, 240))
    web = WebServer(env, tmp_path, roots=[tmp_path]).start()
    client = Client(Settings.from_env(env))
    fleet.start_sweeper()
    worker = fleet.start_worker(["noop", "analysis"], threads=2)
    try:
        # When the noop lane is paused through the web API
        with web.client() as http:
            r = http.post("/api/lanes/noop/pause")
            assert r.status_code == 200, r.text
            assert r.json()["changed"] is True and r.json()["paused"] is True
            assert http.post("/api/lanes/nope/pause").status_code == 404
        # And the web server and the worker restart, then a noop job is submitted
        web.stop()
        fleet.kill(worker)  # the whole worker: its Dramatiq child too
        fleet.start_worker(["noop", "analysis"], threads=2)
        web.start()
        job = client.submit(["noop"], [tmp_path / "files"], {"noop.sleep": "0.05"}).job_id
        other = client.submit(["analysis"], [tmp_path / "photos"]).job_id
        # Then the lane is still paused (the web lists it) and, while a job of the other lane
        # submitted after it runs to its end, the noop job's items are never queued nor claimed
        with web.client() as http:
            lanes = {entry["lane"]: entry for entry in http.get("/api/lanes").json()["lanes"]}
        assert lanes["noop"]["paused"] is True and lanes["analysis"]["paused"] is False
        wait_job_done(engine, other, 120)
        assert item_states(engine, job) == {"pending": 10}
        assert not [e for e in events_of(engine, "item_claimed") if e.job_id == job]
        # When it is resumed through the web API
        with web.client() as http:
            r = http.post("/api/lanes/noop/resume")
            assert r.status_code == 200 and r.json()["changed"] is True and r.json()["paused"] is False
        # Then the job finishes, each item once
        wait_job_done(engine, job, 120)
        _each_succeeded_once(engine, job)
    finally:
        web.stop()
        client.engine.dispose()
