"""Schedules (issue 38, ``store.schedules`` and ``photojobs.schedules``) on SQLite and PostgreSQL:
one run per tick when two claimers race for it (real threads, each its own connection), a tick
while the last run is unfinished skipped and counted, one catch-up run after downtime, a paused
schedule never claimed, and the runner's sync recording its job or its error. Ticks are claimed at
chosen times (``claim_due(at=…)``): no test waits for a clock."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.schedules import ScheduleRunner, next_tick
from photojobs.schedules import add as add_schedule
from photojobs.schedules import resume as resume_schedule
from photojobs.testing.samples import generate_samples
from store import jobs as store_jobs
from store import schedules as store_schedules
from store.control import cancel
from store.lanes import lane_spec
from store.schedules import Claim, claim_due, finish, get

pytestmark = pytest.mark.timeout(120)

EVERY = 60.0
NOOP = lane_spec("noop", env={})


def settings(db_url: str, redis_url: str, **env: str) -> Settings:
    return Settings.from_env({"PHOTOJOBS_DATABASE_URL": db_url, "PHOTOJOBS_REDIS_URL": redis_url, **env})


@pytest.fixture
def library(tmp_path: Path) -> Path:
    folder = tmp_path / "library"
    generate_samples(folder, 3, seed=38, size=(64, 48))
    return folder


@pytest.fixture
def client(engine: Engine, db_url: str, redis_url: str) -> Client:
    return Client(settings(db_url, redis_url), engine, migrate=False)


def a_job(engine: Engine, tmp_path: Path) -> int:
    """A job with one item not finished (no worker runs here)."""
    return store_jobs.submit(engine, [NOOP], [store_jobs.PhotoInput(str(tmp_path / "p.jpg"), 1)]).job_id


def test_two_claimers_racing_for_each_tick_take_it_once(
    engine: Engine, client: Client, library: Path
) -> None:
    # Given a schedule, and two claimers (two fleets' sweepers) started together at each tick
    first = add_schedule(client, "race", ["sync", str(library), "--lanes", "analysis"], every=EVERY).next_run
    ticks = [first + k * EVERY for k in range(15)]
    claims: list[list[Claim]] = []
    lock = threading.Lock()

    def claimer(barrier: threading.Barrier, at: float) -> None:
        barrier.wait()
        got = claim_due(engine, next_tick, at=at)
        with lock:
            claims.append(got)

    # When both claim every tick at the same moment, each run finished before the next tick
    for at in ticks:
        barrier = threading.Barrier(2)
        threads = [threading.Thread(target=claimer, args=(barrier, at)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for c in (c for got in claims[-2:] for c in got):
            finish(engine, c.name, c.at, job=None, error=None)

    # Then each tick was taken by exactly one of them, as a run
    taken = sorted(c.tick for got in claims for c in got)
    assert taken == ticks
    row = get(engine, "race")
    assert (row.runs, row.skipped, row.next_run) == (len(ticks), 0, ticks[-1] + EVERY)


def test_a_tick_while_the_last_run_is_unfinished_is_skipped_and_counted(
    engine: Engine, client: Client, library: Path, tmp_path: Path
) -> None:
    # Given a schedule whose first run was claimed and is still syncing
    t0 = add_schedule(client, "nightly", ["sync", str(library), "--lanes", "analysis"], every=EVERY).next_run
    [run] = claim_due(engine, next_tick, at=t0)
    assert run.run

    # When the next tick comes while the sync is under way
    [skip] = claim_due(engine, next_tick, at=t0 + EVERY)
    # Then it is skipped, counted, and the schedule moves to the tick after
    assert not skip.run
    row = get(engine, "nightly")
    assert (row.runs, row.skipped, row.next_run, row.running) == (1, 1, t0 + 2 * EVERY, True)

    # When the sync ends with a job that is not finished, the next tick is skipped too
    job = a_job(engine, tmp_path)
    assert finish(engine, "nightly", run.at, job=job, error=None)
    [skip] = claim_due(engine, next_tick, at=t0 + 2 * EVERY)
    assert not skip.run
    assert (get(engine, "nightly").runs, get(engine, "nightly").skipped) == (1, 2)

    # When the job finishes (cancelled: it has a job_ends row), the next tick runs
    cancel(engine, job)
    [again] = claim_due(engine, next_tick, at=t0 + 3 * EVERY)
    assert again.run
    row = get(engine, "nightly")
    assert (row.runs, row.skipped, row.last_job, row.running) == (2, 2, None, True)


def test_a_run_whose_sweeper_died_mid_sync_is_over_once_its_heartbeat_is_stale(
    engine: Engine, client: Client, library: Path
) -> None:
    # Given a run claimed whose sweeper died before recording anything (no heartbeat since)
    t0 = add_schedule(client, "orphan", ["sync", str(library), "--lanes", "analysis"], every=EVERY).next_run
    [dead] = claim_due(engine, next_tick, at=t0)

    # When a tick comes within the abandon time, and one after it
    [within] = claim_due(engine, next_tick, at=t0 + EVERY)
    later = t0 + EVERY * (1 + store_schedules.RUN_ABANDONED // EVERY + 1)
    [after] = claim_due(engine, next_tick, at=later)

    # Then the first is skipped, the second runs, and the dead run's late record is refused
    assert (within.run, after.run) == (False, True)
    assert not finish(engine, "orphan", dead.at, job=None, error=None)
    assert finish(engine, "orphan", after.at, job=None, error=None)
    assert (get(engine, "orphan").runs, get(engine, "orphan").skipped) == (2, 1)


def test_after_downtime_a_due_schedule_runs_once_then_keeps_its_cadence(
    engine: Engine, client: Client, library: Path
) -> None:
    # Given a schedule whose sweepers were all down for ten and a half of its ticks
    t0 = add_schedule(client, "hourly", ["sync", str(library), "--lanes", "analysis"], every=EVERY).next_run
    back = t0 + 10.5 * EVERY

    # When a sweeper comes back and claims, twice
    first = claim_due(engine, next_tick, at=back)
    for c in first:
        finish(engine, c.name, c.at, job=None, error=None)
    second = claim_due(engine, next_tick, at=back)

    # Then there was one catch-up run, no burst, and the next run is the next tick of the cadence
    assert [c.run for c in first] == [True]
    assert second == []
    row = get(engine, "hourly")
    assert (row.runs, row.skipped, row.next_run) == (1, 0, t0 + 11 * EVERY)


def test_a_paused_schedule_is_never_claimed_and_resumes_from_its_next_tick(
    engine: Engine, client: Client, library: Path
) -> None:
    # Given a paused schedule
    t0 = add_schedule(client, "weekly", ["sync", str(library), "--lanes", "analysis"], every=EVERY).next_run
    assert store_schedules.pause(engine, "weekly")
    assert not store_schedules.pause(engine, "weekly")  # twice: not an error, nothing changed

    # When its ticks come (and many more)
    claims = claim_due(engine, next_tick, at=t0 + 100 * EVERY)

    # Then none is taken; resumed, it waits for its next tick after now (no run of the missed ones)
    assert claims == []
    assert resume_schedule(engine, "weekly")
    row = get(engine, "weekly")
    now = store_schedules.now(engine)
    assert (row.paused, row.runs, row.skipped) == (False, 0, 0)
    assert now < row.next_run <= now + EVERY
    assert claim_due(engine, next_tick) == []


def test_the_runner_runs_the_command_and_records_its_job_or_its_error(
    engine: Engine, client: Client, library: Path, db_url: str, redis_url: str
) -> None:
    # Given a sync schedule over a library of three photos, and a runner (a sweeper's duty)
    t0 = add_schedule(client, "lib", ["sync", str(library), "--lanes", "analysis"], every=EVERY).next_run
    runner = ScheduleRunner(settings(db_url, redis_url), engine)

    # When its tick is due
    [claim] = runner.run_due(at=t0)

    # Then the sync ran: its job holds the three photos, recorded as the schedule's last job
    row = get(engine, "lib")
    assert claim.run and row.last_job is not None and row.last_error is None
    assert store_jobs.job_status(engine, row.last_job).lanes["analysis"] == {"pending": 3}
    assert row.as_dict()["last_run"] == {"at": claim.at, "job": row.last_job}

    # When its job is finished and the library is gone at the next tick
    cancel(engine, row.last_job)
    for photo in library.iterdir():
        photo.unlink()
    library.rmdir()
    runner.run_due(at=t0 + EVERY)

    # Then the run failed: its error is recorded, no job, and the schedule is not running
    row = get(engine, "lib")
    assert row.last_job is None and row.last_error and str(library) in row.last_error
    assert (row.runs, row.running) == (2, False)


def test_the_schedules_api_adds_lists_pauses_and_removes_inside_the_photo_roots(
    client: Client, tmp_path: Path, library: Path
) -> None:
    # Given the web API with the library as its photo root
    from fastapi.testclient import TestClient

    from photojobs.web import create_app
    from tests.web_support import TOKEN

    app = create_app(client, token=TOKEN, photo_roots=[library], env=dict(client.settings.env))
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        # When a schedule is added over a path of the root (relative: the first root)
        body = {"name": "phone", "every": "15m", "command": ["sync", ".", "--lanes", "analysis"]}
        made = http.post("/api/schedules", json=body)
        # Then it is stored with the command's path made absolute, and listed
        assert made.status_code == 201, made.text
        assert made.json()["command"] == ["sync", "--lanes", "analysis", str(library.resolve())]
        assert made.json()["every"] == 900.0 and made.json()["last_run"] is None
        assert [s["name"] for s in http.get("/api/schedules").json()["schedules"]] == ["phone"]
        # And a second one of the name, a path outside the roots, a bad command are refused
        assert http.post("/api/schedules", json=body).status_code == 409
        away = {**body, "name": "away", "command": ["sync", str(outside), "--lanes", "analysis"]}
        assert http.post("/api/schedules", json=away).json()["error"] == "outside_roots"
        bad = http.post("/api/schedules", json={**body, "name": "bad", "command": ["rm", "-rf", "/"]})
        assert bad.status_code == 400 and "`sync` or `submit`" in bad.json()["message"]
        both = http.post("/api/schedules", json={**body, "name": "both", "cron": "0 3 * * *"})
        assert both.status_code == 400 and "exactly one of --every" in both.json()["message"]
        # When it is paused, resumed and removed
        assert http.post("/api/schedules/phone/pause").json()["paused"] is True
        assert http.post("/api/schedules/phone/resume").json()["changed"] is True
        assert http.delete("/api/schedules/phone").status_code == 200
        # Then it is gone, and the unknown name is a 404 for each action
        assert http.get("/api/schedules").json()["schedules"] == []
        for method, url in (("delete", ""), ("post", "/pause"), ("post", "/resume")):
            r = getattr(http, method)(f"/api/schedules/phone{url}")
            assert r.status_code == 404 and r.json()["error"] == "unknown_schedule"
    # And without the token nothing is listed or changed
    with TestClient(app) as anonymous:
        assert anonymous.get("/api/schedules").status_code == 401
        assert anonymous.post("/api/schedules", json=body).status_code == 401
    # And a session cookie changes nothing without the app's own Origin (CSRF), and does with it
    with TestClient(app) as browser:
        assert browser.post("/api/session", json={"token": TOKEN}).status_code in (200, 204)
        assert browser.get("/api/schedules").status_code == 200
        foreign = browser.post("/api/schedules", json=body, headers={"Origin": "https://evil.example"})
        assert foreign.status_code == 403 and foreign.json()["error"] == "bad_origin"
        assert browser.post("/api/schedules", json=body).status_code == 403  # no Origin at all
        own = browser.post("/api/schedules", json=body, headers={"Origin": "http://testserver"})
        assert own.status_code == 201, own.text


@pytest.mark.parametrize("verb", ["sync", "submit"])
def test_a_run_is_confined_to_the_photo_roots_of_the_sweeper_that_runs_it(
    engine: Engine, client: Client, library: Path, tmp_path: Path, db_url: str, redis_url: str, verb: str
) -> None:
    # Given a schedule over the library, and a sweeper whose photo roots leave the library out
    t0 = add_schedule(client, "lib", [verb, str(library), "--lanes", "analysis"], every=EVERY).next_run
    (tmp_path / "other").mkdir()
    runner = ScheduleRunner(
        settings(db_url, redis_url, PHOTOJOBS_PHOTO_ROOTS=str(tmp_path / "other")), engine
    )

    # When its tick is due
    [claim] = runner.run_due(at=t0)

    # Then the run is refused as outside the roots: no job, the reason recorded
    row = get(engine, "lib")
    assert claim.run and row.last_job is None and row.running is False
    assert row.last_error and "photo roots" in row.last_error
