"""Issue 41: the operator's verbs the console has, in the CLI — ``workers``, ``discard``, ``bulk`` —
and ``status --watch``. The CLI in-process (click's runner) against a real store, both stores."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs import cli as cli_module
from photojobs.cli import cli
from store import items as store_items
from store import jobs as store_jobs
from store.fencing import fenced
from store.lanes import all_lanes
from store.models import Item
from store.status import job_status

SPECS = all_lanes({})
WORKER = "host-a:4242:w1"


def _env(engine: Engine) -> dict[str, str]:
    return {"PHOTOJOBS_DATABASE_URL": engine.url.render_as_string(hide_password=False)}


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        rows = list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())
        for r in rows:
            s.expunge(r)
    return rows


def _claim(engine: Engine, item: Item) -> store_items.Lease:
    lease = store_items.claim(engine, SPECS[item.lane], item.id, item.fencing_token, WORKER).lease
    assert lease is not None
    return lease


def _finish(engine: Engine, item: Item, error: str | None) -> None:
    lease = _claim(engine, item)
    with fenced(engine, item.id, lease.token) as s:
        if error is None:
            store_items.succeed(s, lease, None, WORKER)
        else:
            store_items.fail(s, SPECS[item.lane], lease, error, WORKER, retry=False)


def _job(engine: Engine, tmp: Path, outcomes: list[str | None], tag: str) -> int:
    """A noop job of one item per outcome (None: succeeded, text: failed with it), each run once."""
    photos = [store_jobs.PhotoInput(str(tmp / f"{tag}{i}.jpg")) for i in range(len(outcomes))]
    job = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    for item, outcome in zip(_items(engine, job), outcomes, strict=True):
        _finish(engine, item, outcome)
    return job


def test_discard_gives_up_on_the_failed_items_and_a_second_discard_or_a_retry_has_nothing_left(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job with one succeeded and two failed items
    job = _job(engine, tmp_path, [None, "OSError: boom", "OSError: boom"], "d")
    runner = CliRunner()
    # When its failed items are discarded
    out = runner.invoke(cli, ["discard", str(job), "--json"], env=_env(engine))
    # Then both are skipped, the job ends partial, and nothing is left to discard or retry
    assert out.exit_code == 0, out.output
    assert json.loads(out.output) == {"job": job, "discarded": 2, "state": "partial"}
    assert [i.state for i in _items(engine, job)] == ["succeeded", "skipped", "skipped"]
    again = runner.invoke(cli, ["discard", str(job)], env=_env(engine))
    assert again.exit_code == 1 and "has no failed item to discard" in again.output
    retried = runner.invoke(cli, ["retry", str(job)], env=_env(engine))
    assert retried.exit_code == 1, retried.output
    assert [i.state for i in _items(engine, job)] == ["succeeded", "skipped", "skipped"]


def test_discard_of_an_unknown_job_names_it(engine: Engine) -> None:
    out = CliRunner().invoke(cli, ["discard", "999"], env=_env(engine))
    assert out.exit_code == 1 and "999" in out.output


def test_bulk_retry_where_partial_takes_every_partial_job_and_leaves_the_others(
    engine: Engine, tmp_path: Path
) -> None:
    # Given two partial jobs (one failed item each) and a succeeded one
    partial = [_job(engine, tmp_path, [None, "OSError: boom"], f"p{n}") for n in range(2)]
    done = _job(engine, tmp_path, [None], "s")
    runner = CliRunner()
    # When the failed items of every partial job are retried in bulk
    out = runner.invoke(cli, ["bulk", "retry", "--where", "partial", "--json"], env=_env(engine))
    # Then both partial jobs run again (their failed item pending), the succeeded one is untouched
    assert out.exit_code == 0, out.output
    report = json.loads(out.output)
    assert sorted(report["job_ids"]) == sorted(partial) and report["jobs"] == 2
    assert report["items"] == 2 and report["skipped"] == 0
    for job in partial:
        assert job_status(engine, job).state == "running"
        assert [i.state for i in _items(engine, job)][1] in ("pending", "queued")
    assert job_status(engine, done).state == "succeeded"


def test_bulk_cancel_counts_a_finished_job_as_skipped_and_cancels_the_running_one(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a running job (nothing run yet) and a succeeded one
    photos = [store_jobs.PhotoInput(str(tmp_path / f"r{i}.jpg")) for i in range(3)]
    running = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    done = _job(engine, tmp_path, [None], "s")
    # When both are cancelled in bulk
    out = CliRunner().invoke(cli, ["bulk", "cancel", str(running), str(done)], env=_env(engine))
    # Then the running one is cancelled, the finished one skipped and still succeeded
    assert out.exit_code == 0, out.output
    assert "1 job(s) changed" in out.output and "1 job(s) skipped" in out.output
    assert job_status(engine, running).state == "cancelled"
    assert job_status(engine, done).state == "succeeded"


@pytest.mark.parametrize("args", [["bulk", "retry"], ["bulk", "retry", "1", "--where", "failed"]])
def test_bulk_needs_jobs_or_a_state_but_not_both(engine: Engine, args: list[str]) -> None:
    out = CliRunner().invoke(cli, args, env=_env(engine))
    assert out.exit_code == 64 and "--where STATE" in out.output


def test_workers_lists_a_lease_holder_and_the_item_it_runs(engine: Engine, tmp_path: Path) -> None:
    # Given a worker holding one item of a job (claimed, running)
    job = store_jobs.submit(engine, [SPECS["noop"]], [store_jobs.PhotoInput(str(tmp_path / "w.jpg"))]).job_id
    item = _items(engine, job)[0]
    _claim(engine, item)
    runner = CliRunner()
    # When the workers are listed, as JSON and as text
    as_json = runner.invoke(cli, ["workers", "--json"], env=_env(engine))
    text = runner.invoke(cli, ["workers"], env=_env(engine))
    # Then the worker is live, holds that item, and the text names the job, item and photo it runs
    assert as_json.exit_code == 0 and text.exit_code == 0, (as_json.output, text.output)
    (worker,) = [w for w in json.loads(as_json.output)["workers"] if w["id"] == WORKER]
    assert worker["state"] == "live" and worker["items"] == [item.id] and worker["held"] == 1
    assert WORKER in text.output and f"job {job} item {item.id} noop" in text.output
    assert str(tmp_path / "w.jpg") in text.output


def test_status_watch_shows_the_job_again_until_it_has_finished(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job of two items, one finished
    photos = [store_jobs.PhotoInput(str(tmp_path / f"s{i}.jpg")) for i in range(2)]
    job = store_jobs.submit(engine, [SPECS["noop"]], photos).job_id
    first, second = _items(engine, job)
    _finish(engine, first, None)
    # When it is watched, and its last item finishes while the watch waits for its next look
    looks: list[float] = []

    def sleep(seconds: float) -> None:
        looks.append(seconds)
        if len(looks) == 1:
            _finish(engine, second, None)

    monkeypatch.setattr(cli_module.time, "sleep", sleep)
    out = CliRunner().invoke(cli, ["status", str(job), "--watch", "--interval", "0.5"], env=_env(engine))
    # Then it showed the job unfinished (no worker here: waiting), then succeeded, and ended there
    # (one wait, exit 0)
    assert out.exit_code == 0, out.output
    heads = [line for line in out.output.splitlines() if line.startswith(f"job {job}: ")]
    assert heads == [f"job {job}: waiting (no live worker)", f"job {job}: succeeded"], out.output
    assert looks == [0.5]


def test_status_watch_of_a_finished_job_shows_it_once(engine: Engine, tmp_path: Path) -> None:
    job = _job(engine, tmp_path, [None], "f")
    out = CliRunner().invoke(cli, ["status", str(job), "--watch", "--json"], env=_env(engine))
    assert out.exit_code == 0, out.output
    (line,) = out.output.splitlines()
    assert json.loads(line)["state"] == "succeeded"
