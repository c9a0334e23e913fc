"""Issue 41: why a job is not moving (``store.waiting``), on SQLite and PostgreSQL: a paused lane, a
lane no live worker serves, items in backoff, a photo another job holds, the job's own pause — each
named with its lane and item count in ``Client.status``, ``GET /api/jobs/{id}``, the jobs list
(``waiting (lane paused)`` instead of ``running``) and ``photojobs status`` (text and ``--json``);
the Lanes page's ``paused`` counter counts the pending items a paused lane holds."""

from __future__ import annotations

import json
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
from store import waiting as store_waiting
from store import workers as store_workers
from store.fencing import fenced
from store.lane_control import pause_lane
from store.lanes import all_lanes
from store.models import Item
from store.photo_locks import EXCLUSIVE, LockRequest
from tests.web_support import TOKEN

SPECS = all_lanes({})


def _submit(engine: Engine, tmp: Path, n: int, lane: str = "noop", tag: str = "p") -> int:
    photos = [store_jobs.PhotoInput(str(tmp / f"{tag}{i}.jpg")) for i in range(n)]
    return store_jobs.submit(engine, [SPECS[lane]], photos).job_id


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        return list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())


def _live_worker(engine: Engine, *lanes: str) -> None:
    """A worker that beats now for ``lanes`` (the registry row a real worker writes)."""
    store_workers.beat(engine, "host:4242:w", lanes=list(lanes), interval=5.0, held=0, threads=2)


@pytest.fixture
def client(engine: Engine, redis_url: str) -> Client:
    env = {"PHOTOJOBS_DATABASE_URL": str(engine.url), "PHOTOJOBS_REDIS_URL": redis_url}
    return Client(Settings.from_env(env), engine, migrate=False)


@pytest.fixture
def http(client: Client, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(client, token=TOKEN, photo_roots=[tmp_path], env=client.settings.env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


def _cli(engine: Engine, redis_url: str, *args: str) -> str:
    url = engine.url.render_as_string(hide_password=False)
    env = {"PHOTOJOBS_DATABASE_URL": url, "PHOTOJOBS_REDIS_URL": redis_url}
    result = CliRunner().invoke(cli, list(args), env=env)
    assert result.exit_code == 0, result.output
    return result.output


def test_a_job_held_by_a_paused_lane_says_so_everywhere(
    engine: Engine, redis_url: str, client: Client, http: TestClient, tmp_path: Path
) -> None:
    """Given a live worker serving noop and a 40-item noop job, and the noop lane paused
    When its status is read through the Client, the API, the jobs list and ``photojobs status``
    Then each names the paused lane with 40 items, the state shows as ``waiting (lane paused)``,
    and the Lanes page's ``paused`` counter reads 40."""
    _live_worker(engine, "noop")
    job = _submit(engine, tmp_path, 40)
    pause_lane(engine, "noop", "test")
    st = client.status(job)
    assert st.state == "running"
    assert [(w["lane"], w["reason"], w["items"]) for w in st.waiting or []] == [("noop", "lane paused", 40)]
    assert st.waiting_for == "lane paused" and st.shown_state() == "waiting (lane paused)"
    body = http.get(f"/api/jobs/{job}").json()
    assert body["waiting"][0]["reason"] == "lane paused" and body["waiting"][0]["since"] > 0
    listed = {j["job"]: j for j in http.get("/api/jobs").json()["jobs"]}
    assert listed[job]["waiting_for"] == "lane paused"
    lanes = {x["lane"]: x for x in http.get("/api/console/lanes").json()["lanes"]}
    assert lanes["noop"]["paused"] is True and lanes["noop"]["depth"]["paused"] == 40
    text = _cli(engine, redis_url, "status", str(job))
    assert f"job {job}: waiting (lane paused)" in text
    assert "40 item(s) of noop held: lane noop is paused" in text and "photojobs lane resume noop" in text
    as_json = json.loads(_cli(engine, redis_url, "status", str(job), "--json"))
    assert as_json["waiting"][0]["reason"] == "lane paused" and as_json["waiting_for"] == "lane paused"
    assert "waiting (lane paused)" in _cli(engine, redis_url, "jobs")


def test_a_lane_no_live_worker_serves_is_named(engine: Engine, client: Client, tmp_path: Path) -> None:
    """Given a worker that serves only analysis and a 3-item noop job
    When the job's status is read
    Then its 3 items wait because no live worker serves noop, and the job shows as waiting on it."""
    _live_worker(engine, "analysis")
    job = _submit(engine, tmp_path, 3)
    st = client.status(job)
    assert [(w["lane"], w["reason"], w["items"]) for w in st.waiting or []] == [("noop", "no live worker", 3)]
    assert st.shown_state() == "waiting (no live worker)"
    # And once a worker for noop beats, nothing holds them
    _live_worker(engine, "noop")
    assert client.status(job).waiting == [] and client.status(job).shown_state() == "running"


def test_items_in_backoff_name_when_they_may_run(engine: Engine, client: Client, tmp_path: Path) -> None:
    """Given a live noop worker and a 2-item job whose first item failed once and was rescheduled
    When the job's status is read
    Then one item is in backoff until a time after now; the other is free, so the job is running."""
    _live_worker(engine, "noop")
    job = _submit(engine, tmp_path, 2)
    first = _items(engine, job)[0]
    spec = SPECS["noop"]
    lease = store_items.claim(engine, spec, first.id, first.fencing_token, "host:4242:w").lease
    assert lease is not None
    with fenced(engine, first.id, lease.token) as s:
        store_items.fail(s, spec, lease, "OSError: busy", "host:4242:w", retry=True)
    st = client.status(job)
    entries = st.waiting or []
    assert [(w["lane"], w["reason"], w["items"]) for w in entries] == [("noop", "backoff", 1)]
    assert entries[0]["until"] > st.created_at
    assert st.waiting_for is None and st.shown_state() == "running"


def test_a_photo_locked_by_another_job_names_that_job(engine: Engine, client: Client, tmp_path: Path) -> None:
    """Given a live exif worker, job A's exif item running with an exclusive lock on a photo, and
    job B's exif item of the same photo deferred by that lock
    When job B's status is read
    Then its item waits because its photo is locked by job A (not as a backoff), and B shows as
    waiting on it."""
    _live_worker(engine, "exif")
    a = _submit(engine, tmp_path, 1, "exif", "same")
    b = _submit(engine, tmp_path, 1, "exif", "same")
    spec = SPECS["exif"]
    held = _items(engine, a)[0]
    lock = LockRequest(EXCLUSIVE, 30)
    assert store_items.claim(engine, spec, held.id, held.fencing_token, "h:1:a", lock).lease
    waiter = _items(engine, b)[0]
    out = store_items.claim(engine, spec, waiter.id, waiter.fencing_token, "h:1:b", lock)
    assert out.lease is None
    st = client.status(b)
    assert [(w["lane"], w["reason"], w["items"], w.get("jobs")) for w in st.waiting or []] == [
        ("exif", "photo locked", 1, [a])
    ]
    assert st.shown_state() == "waiting (photo locked)"


def test_a_paused_job_names_its_own_pause(engine: Engine, client: Client, tmp_path: Path) -> None:
    """Given a live noop worker and a paused 3-item job
    When its status is read
    Then its 3 items are named as paused with the job (its state stays ``paused``)."""
    _live_worker(engine, "noop")
    job = _submit(engine, tmp_path, 3)
    control.pause(engine, job)
    st = client.status(job)
    assert [(w["lane"], w["reason"], w["items"]) for w in st.waiting or []] == [("noop", "job paused", 3)]
    assert st.state == "paused" and st.shown_state() == "paused"


def test_a_finished_job_costs_no_waiting_query(engine: Engine, tmp_path: Path) -> None:
    """Given a job cancelled before it ran
    When why it waits is asked
    Then the answer is empty (nothing pending, queued or paused: nothing is looked up)."""
    job = _submit(engine, tmp_path, 2)
    control.cancel(engine, job)
    st = store_jobs.job_status(engine, job)
    assert store_waiting.waiting(engine, [st]) == {job: []}
