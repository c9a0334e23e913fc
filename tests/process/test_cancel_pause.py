"""Cooperative cancel / pause / resume with real workers (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

import redis
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from store.events import read_events
from tests.support import Fleet, event_counts, events_of, item_states, items_of, make_files, wait_for

TERMINAL = {"succeeded", "failed", "cancelled", "skipped"}


def test_cancel_mid_run_leaves_only_terminal_items(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 30-item job running on two workers
    make_files(tmp_path / "photos", 30)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "2"}).job_id
    fleet.start_sweeper()
    fleet.start_worker(threads=2)
    fleet.start_worker(threads=2)
    wait_for(lambda: item_states(engine, job).get("running", 0) >= 2, 60, what="items running")
    # When the job is cancelled
    client.cancel(job)
    # Then not-yet-running items are cancelled at once, running ones stop at a safe point
    wait_for(lambda: set(item_states(engine, job)) <= TERMINAL, 60, what="every item terminal")
    states = item_states(engine, job)
    assert client.status(job).state == "cancelled"
    # Counted exactly: every one of the 30 items ended once, succeeded (it finished before its stop)
    # or cancelled — at once by the cancel (as many as it says) or stopped by its worker; none failed
    assert sum(states.values()) == 30 and set(states) <= {"succeeded", "cancelled"}, states
    [request] = [e for e in events_of(engine, "job_cancel_requested") if e.job_id == job]
    cancelled = [e for e in events_of(engine, "item_cancelled") if e.job_id == job]
    at_once = [e for e in cancelled if e.worker is None]
    stopped = [e for e in cancelled if e.worker is not None]
    assert len(at_once) == request.detail["cancelled_now"], (len(at_once), request.detail)
    assert len({e.item_id for e in cancelled}) == len(cancelled) == states.get("cancelled", 0)
    succeeded = event_counts(engine, "item_succeeded", job)
    assert set(succeeded.values()) <= {1} and len(succeeded) == states.get("succeeded", 0)
    # (a cancelled item gives its attempt back: its worker's item_cancelled event says it was running)
    assert stopped, "a running item should have been stopped cooperatively"
    # And nothing was claimed after the cancel was asked for (events in commit order)
    log = [(e.type, e.item) for e in read_events(engine, job_id=job, limit=10_000)]
    after = log[log.index(("job_cancel_requested", None)) :]
    assert [i for t, i in after if t == "item_claimed"] == [], after
    client.engine.dispose()


def test_pause_then_resume_finishes_every_item_once_reading_the_checkpoint(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 12-item job whose items checkpoint every half second
    make_files(tmp_path / "photos", 12)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "2"}).job_id
    fleet.start_sweeper()
    fleet.start_worker(threads=2)
    wait_for(
        lambda: any(i.checkpoint for i in items_of(engine, job) if i.state == "running"),
        60,
        what="a running item with a checkpoint",
    )
    # When the job is paused
    client.pause(job)
    wait_for(lambda: client.status(job).state == "paused", 60, what="the job to be paused")
    paused = [i for i in items_of(engine, job) if i.state == "paused" and i.checkpoint]
    assert paused, "a running item should have stopped at a checkpoint"
    assert "running" not in item_states(engine, job)
    # And resumed
    client.resume(job)
    wait_for(lambda: client.status(job).state == "succeeded", 90, what="the job to succeed")
    # Then every item succeeded exactly once, and the interrupted ones resumed from their checkpoint
    assert set(event_counts(engine, "item_succeeded", job).values()) == {1}
    assert len(event_counts(engine, "item_succeeded", job)) == 12
    resumed = {i.id: i.result for i in items_of(engine, job) if i.id in {p.id for p in paused}}
    assert all(r and r["resumed_from"] for r in resumed.values()), resumed
    client.engine.dispose()


def test_messages_of_a_paused_job_are_skipped_quietly(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 16-item job with messages waiting in Redis behind one busy worker thread
    make_files(tmp_path / "photos", 16)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "1"}).job_id
    fleet.start_sweeper()
    fleet.start_worker(threads=1)
    broker = redis.Redis.from_url(env["PHOTOJOBS_REDIS_URL"])
    wait_for(lambda: item_states(engine, job).get("running", 0) >= 1, 60, what="an item running")
    wait_for(lambda: broker.llen("dramatiq:photojobs.noop") >= 1, 60, what="messages waiting in Redis")
    # When the job is paused and the worker then receives the waiting messages
    client.pause(job)
    wait_for(lambda: client.status(job).state == "paused", 60, what="the job to be paused")
    wait_for(lambda: broker.llen("dramatiq:photojobs.noop") == 0, 60, what="the waiting messages to be taken")
    # Then they are normal skips: no rejection events, no warning per message
    assert event_counts(engine, "message_rejected") == {}  # (a rejection names no job)
    logs = fleet.logs()
    assert "rejected message" not in logs and "was skipped" not in logs, logs[-3000:]
    broker.close()
    client.engine.dispose()
