"""A schedule run by two fleets' sweeper services (two ``photojobs sweep`` processes on one store,
one Redis) and a real noop worker, on SQLite and PostgreSQL (issue 38): added with
``photojobs schedule add``, every second, each run a submission whose one item takes seconds.
Each tick is run by one sweeper only and a run never overlaps the one before: every job the
schedule made was created after the previous one had finished (its ``job_ends`` row), the jobs
are as many as the runs counted, and the ticks that came during a slow run were skipped, counted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from store.models import Job, JobEnd
from store.schedules import get
from tests.support import Fleet, photojobs, wait_for
from tests.web_support import TIMEOUT_MS, TOKEN, browser, serving  # noqa: F401 - browser: a fixture

pytestmark = pytest.mark.timeout(300)


def schedules(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    done = photojobs(env, "schedule", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {d["name"]: d for d in json.loads(done.stdout)}


def jobs_and_ends(engine: Engine) -> list[tuple[int, float, float | None]]:
    """(job, created_at, finished_at or None) of every job, by id."""
    with Session(engine) as s:
        rows = s.execute(
            select(Job.id, Job.created_at, JobEnd.finished_at)
            .outerjoin(JobEnd, JobEnd.job_id == Job.id)
            .order_by(Job.id)
        ).all()
    return [(r[0], float(r[1]), None if r[2] is None else float(r[2])) for r in rows]


def test_a_schedule_on_two_fleets_runs_once_per_tick_and_never_overlaps_a_slow_run(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given two sweeper services (two fleets) and a worker on one store, and a schedule every
    # second whose runs each submit a job that takes seconds
    photo = tmp_path / "library" / "slow.jpg"
    photo.parent.mkdir()
    photo.write_bytes(b"not looked at by the noop lane")
    fleet.start_sweeper()
    fleet.start_sweeper()
    fleet.start_worker(["noop"], threads=1)
    added = photojobs(
        env, "schedule", "add", "slow", "--every", "1s", "--",
        "submit", str(photo.parent), "--lanes", "noop", "--param", "noop.sleep=3",
    )  # fmt: skip
    assert added.returncode == 0, added.stderr

    # When it has run three times and skipped ticks while its runs were unfinished
    wait_for(lambda: get(engine, "slow").runs >= 3, timeout=150, interval=0.5, what="three runs")
    assert photojobs(env, "schedule", "pause", "slow").returncode == 0

    # Then each of its jobs was created after the one before had finished (no overlap)
    jobs = jobs_and_ends(engine)
    for (_, _, ended), (later, created, _) in zip(jobs, jobs[1:], strict=False):
        assert ended is not None and created >= ended, f"job {later} started before the one before ended"
    # And each run made one job (no tick run twice), once the submission under way has landed
    wait_for(
        lambda: get(engine, "slow").running_since is None,
        timeout=60,
        interval=0.5,
        what="no submission under way",
    )
    shown = schedules(env)["slow"]
    jobs = jobs_and_ends(engine)
    assert len(jobs) == shown["runs"] >= 3
    assert shown["skipped"] >= 1
    assert shown["last_run"]["job"] == jobs[-1][0] and shown["last_error"] is None


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_console_lists_schedules_and_pauses_and_resumes_one(
    browser: Any,  # noqa: F811 - the fixture imported above
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    from playwright.sync_api import expect

    expect.set_options(timeout=TIMEOUT_MS)
    photos = tmp_path / "photos"
    (photos / "phone").mkdir(parents=True)
    with serving(env, tmp_path, [photos]) as server:
        # Given a schedule added over HTTP
        http = server.client()
        body = {"name": "phone", "every": "1h", "command": ["sync", "phone", "--lanes", "analysis"]}
        assert http.post("/api/schedules", json=body).status_code == 201
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(server.url + "/")
        page.fill("#token", TOKEN)
        page.click("#login-form button[type=submit]")
        # When the operator opens the Schedules page
        page.click("#nav-schedules")
        card = page.locator('#schedules .schedule[data-schedule="phone"]')
        # Then the schedule is listed with its command, waiting for its first run
        expect(card).to_have_attribute("data-state", "waiting")
        expect(card).to_contain_text(f"sync --lanes analysis {(photos / 'phone').resolve()}")
        expect(card).to_contain_text("never run")
        # When it is paused, then resumed, from the page
        card.locator("button.act-schedule-pause").click()
        expect(card).to_have_attribute("data-state", "paused")
        assert http.get("/api/schedules").json()["schedules"][0]["paused"] is True
        card.locator("button.act-schedule-resume").click()
        expect(card).to_have_attribute("data-state", "waiting")
        assert errors == []
