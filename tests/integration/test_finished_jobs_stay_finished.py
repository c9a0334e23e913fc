"""Issue 41: a finished job stays finished. ``photojobs pause/cancel/resume`` and the web API's
control routes go through one rule (``store.control.CONTROL_APPLIES``, decided under the job's row
lock): a succeeded, partial, failed or cancelled job refuses every one of them, naming its state, and
nothing changes. Both paths, both stores (the CLI and the app in-process, a real store)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.cli import cli
from photojobs.config import Settings
from photojobs.web import create_app
from store import control
from store import items as store_items
from store import jobs as store_jobs
from store.fencing import fenced
from store.lanes import all_lanes
from store.models import Event, Item, Job
from tests.web_support import TOKEN

SPECS = all_lanes({})
ACTIONS = ("pause", "cancel", "resume")


def _finish(engine: Engine, item: Item, error: str | None) -> None:
    spec = SPECS[item.lane]
    lease = store_items.claim(engine, spec, item.id, item.fencing_token, "host:1:w").lease
    assert lease is not None
    with fenced(engine, item.id, lease.token) as s:
        if error is None:
            store_items.succeed(s, lease, None, "host:1:w")
        else:
            store_items.fail(s, spec, lease, error, "host:1:w", retry=False)


def _job(engine: Engine, tmp: Path, outcomes: list[str | None], tag: str) -> int:
    """A noop job of one item per outcome (None: succeeded, text: failed with it), each run once."""
    photos = [store_jobs.PhotoInput(str(tmp / f"{tag}{i}.jpg")) for i in range(len(outcomes))]
    job = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    with Session(engine) as s:
        items = list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())
    for item, outcome in zip(items, outcomes, strict=True):
        _finish(engine, item, outcome)
    return job


@pytest.fixture
def finished(engine: Engine, tmp_path: Path) -> dict[str, int]:
    """One job in each finished state: succeeded, partial, failed, cancelled (before it ran)."""
    jobs = {
        "succeeded": _job(engine, tmp_path, [None, None], "s"),
        "partial": _job(engine, tmp_path, [None, "OSError: boom"], "p"),
        "failed": _job(engine, tmp_path, ["OSError: boom"], "f"),
    }
    photos = [store_jobs.PhotoInput(str(tmp_path / "c0.jpg"))]
    jobs["cancelled"] = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    control.cancel(engine, jobs["cancelled"])
    for state, job in jobs.items():
        assert store_jobs.job_status(engine, job).state == state
    return jobs


def _snapshot(engine: Engine, job: int) -> tuple[object, ...]:
    """What a control would change: the job's control, its items' states, its event count."""
    with Session(engine) as s:
        ctl = s.execute(select(Job.control).where(Job.id == job)).scalar_one()
        states = tuple(s.execute(select(Item.state).where(Item.job_id == job).order_by(Item.id)).scalars())
        events = len(s.execute(select(Event.id).where(Event.job_id == job)).all())
    return ctl, states, events


@pytest.fixture
def http(engine: Engine, redis_url: str, tmp_path: Path) -> Iterator[TestClient]:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    client = Client(Settings.from_env(env), engine, migrate=False)
    app = create_app(client, token=TOKEN, photo_roots=[tmp_path], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def test_the_cli_refuses_to_pause_cancel_or_resume_a_finished_job_naming_its_state(
    engine: Engine, redis_url: str, finished: dict[str, int]
) -> None:
    """Given a succeeded, a partial, a failed and a cancelled job
    When ``photojobs pause``, ``cancel`` and ``resume`` are run on each
    Then each exits non-zero saying ``cannot ACTION job N: it is STATE``, and nothing changed:
    the job's control, its items and its events are as they were."""
    url = engine.url.render_as_string(hide_password=False)
    env = {"PHOTOJOBS_DATABASE_URL": url, "PHOTOJOBS_REDIS_URL": redis_url}
    runner = CliRunner()
    for state, job in finished.items():
        before = _snapshot(engine, job)
        for action in ACTIONS:
            result = runner.invoke(cli, [action, str(job)], env=env)
            assert result.exit_code == 1, (state, action, result.output)
            assert f"cannot {action} job {job}: it is {state}" in result.output
            assert "has finished" in result.output
        assert _snapshot(engine, job) == before, state
        assert store_jobs.job_status(engine, job).state == state


def test_the_api_refuses_the_same_with_409_and_the_same_words(
    engine: Engine, http: TestClient, finished: dict[str, int]
) -> None:
    """Given the same four finished jobs
    When ``POST /api/jobs/N/pause|cancel|resume`` is sent for each
    Then each is a 409 ``not_applicable`` with the CLI's message, and nothing changed."""
    for state, job in finished.items():
        before = _snapshot(engine, job)
        for action in ACTIONS:
            r = http.post(f"/api/jobs/{job}/{action}")
            assert r.status_code == 409, (state, action, r.text)
            assert f"cannot {action} job {job}: it is {state}" in r.text
        assert _snapshot(engine, job) == before, state


def test_the_store_rule_still_lets_a_running_job_be_paused_resumed_and_cancelled(
    engine: Engine, tmp_path: Path
) -> None:
    """Given a job with work still to do
    When it is paused, resumed and cancelled through ``store.control``
    Then each applies (items move), and a second cancel of the now cancelled job is refused."""
    photos = [store_jobs.PhotoInput(str(tmp_path / f"r{i}.jpg")) for i in range(3)]
    job = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    assert control.pause(engine, job) == 3
    with pytest.raises(control.ControlRefused, match="it is paused"):
        control.pause(engine, job)
    assert control.resume(engine, job) == 3
    assert control.cancel(engine, job) == 3
    with pytest.raises(control.ControlRefused, match="it is cancelled"):
        control.cancel(engine, job)
