"""Issue 41: the CLI's small lies. Its text output never prints Python's ``None`` for a field an
event does not have (``events`` printed ``attempt=None token=None`` on every job event); every
listing's JSON has one shape (``lane list --json`` was a bare list). The CLI in-process against a
real store, both stores."""

from __future__ import annotations

import json
import socket
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import Engine

from photojobs.cli import cli
from store import jobs as store_jobs
from store.events import assign_cursors
from store.lanes import all_lanes
from store.workers import record_exit

SPECS = all_lanes({})


def test_events_text_names_only_the_fields_an_event_has(engine: Engine, tmp_path: Path) -> None:
    """Given a submitted job (events without attempt or token) and a worker's recorded crash (an
    event without a job)
    When ``photojobs events`` is run
    Then no line says ``None``; the job's events name the job, the crash names none."""
    photos = [store_jobs.PhotoInput(str(tmp_path / "n0.jpg"))]
    job = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    record_exit(engine, "crashed", worker="host:123", detail={"slot": 0, "returncode": 3, "signal": None})
    assign_cursors(engine)
    env = {"PHOTOJOBS_DATABASE_URL": engine.url.render_as_string(hide_password=False)}
    out = CliRunner().invoke(cli, ["events"], env=env)
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines and not [line for line in lines if "None" in line.replace('"signal": null', "")], lines
    assert any(f"job {job}" in line and "job_submitted" in line for line in lines), lines
    crash = [line for line in lines if "worker_crashed" in line]
    assert crash and "job " not in crash[0] and "attempt=" not in crash[0], crash


def test_lane_list_json_has_the_shape_of_every_listing(engine: Engine) -> None:
    """Given a store
    When ``photojobs lane list --json`` is run
    Then it prints ``{"lanes": [...], "next": null}`` like ``jobs --json`` and ``items --json``
    (it was a bare list), every lane listed once."""
    env = {"PHOTOJOBS_DATABASE_URL": engine.url.render_as_string(hide_password=False)}
    out = CliRunner().invoke(cli, ["lane", "list", "--json"], env=env)
    assert out.exit_code == 0, out.output
    listed = json.loads(out.output)
    assert set(listed) == {"lanes", "next"} and listed["next"] is None
    assert sorted(entry["lane"] for entry in listed["lanes"]) == sorted(SPECS)


def test_submit_with_redis_down_says_the_job_waits_in_the_store(engine: Engine, tmp_path: Path) -> None:
    """Given a store and a Redis URL nothing listens on
    When ``photojobs submit`` is run
    Then it exits 0 printing the job id (the job is in the store), and says on stderr that Redis did
    not answer and the job runs once Redis is back and a sweeper dispatches it."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead = probe.getsockname()[1]  # closed when the block ends: nothing listens there
    photo = tmp_path / "r.jpg"
    photo.write_bytes(b"not really a jpeg")
    env = {
        "PHOTOJOBS_DATABASE_URL": engine.url.render_as_string(hide_password=False),
        "PHOTOJOBS_REDIS_URL": f"redis://127.0.0.1:{dead}/0",
    }
    out = CliRunner().invoke(cli, ["submit", "--lanes", "noop", str(photo)], env=env)
    assert out.exit_code == 0, out.output
    job = int(out.stdout.strip())
    assert f"job {job} is queued in the store, but Redis did not answer" in out.stderr
    assert store_jobs.job_status(engine, job).totals()["pending"] == 1
