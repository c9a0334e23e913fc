"""Webhook delivery state (issue 38, ``store.webhooks``) on SQLite and PostgreSQL, driven by real job
finishes (no workers, no HTTP): the cursor moves only after a delivery is recorded, in cursor
order; one deliverer holds a target (compare-and-set with a lease) and a deliverer that lost it
records nothing; a failed attempt backs off exponentially, capped; the API and the metrics show
each target's state and lag."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, update

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import create_app
from store import items as store_items
from store import jobs as store_jobs
from store import webhooks
from store.dispatch import take_for_dispatch
from store.fencing import fenced
from store.lanes import lane_spec
from store.models import WebhookState
from tests.metrics_support import parse_scrape, sample
from tests.web_support import TOKEN

pytestmark = pytest.mark.timeout(120)

NOOP = lane_spec("noop", env={})
URL = "http://127.0.0.1:9/hook"


def finish_job(engine: Engine, tmp_path: Path, name: str, n: int = 2) -> int:
    """A job of ``n`` photos, every item claimed and succeeded: its ``job_finished`` is written."""
    photos = [store_jobs.PhotoInput(str(tmp_path / f"{name}{i}.jpg"), 1) for i in range(n)]
    job = store_jobs.submit(engine, [NOOP], photos).job_id
    for p in take_for_dispatch(engine, NOOP):
        lease = store_items.claim(engine, NOOP, p.item_id, p.token, "w").lease
        assert lease is not None
        with fenced(engine, lease.item_id, lease.token, worker="w") as s:
            store_items.succeed(s, lease, None, "w")
    return job


def one_target(engine: Engine) -> dict:
    (row,) = webhooks.status(engine)
    return row


def test_events_are_delivered_in_cursor_order_and_the_cursor_moves_only_after_a_recorded_delivery(
    engine: Engine, tmp_path: Path
) -> None:
    # Given two finished jobs and a target held by one deliverer
    first, second = finish_job(engine, tmp_path, "a"), finish_job(engine, tmp_path, "b")
    target = webhooks.target_of(URL)
    webhooks.ensure(engine, target, "127.0.0.1:9")
    webhooks.ensure(engine, target, "127.0.0.1:9")  # twice: one row
    assert webhooks.claim(engine, target, "s1", 30.0)
    # When the first event is read but its delivery is not recorded (the receiver did not answer)
    d = webhooks.next_delivery(engine, target)
    assert d is not None and d.job == first and d.state == "succeeded" and d.counts == {"succeeded": 2}
    assert d.body() == {
        "event": "job_finished",
        "job": first,
        "state": "succeeded",
        "counts": {"succeeded": 2},
        "cursor": d.cursor,
    }
    # Then it is read again (at least once), and the lag counts both jobs
    assert webhooks.next_delivery(engine, target) == d
    assert one_target(engine)["lag"] == 2
    # When its delivery is recorded
    assert webhooks.delivered(engine, d, "s1", 204, 30.0)
    # Then the next one is the second job's, and recording the first again changes nothing
    d2 = webhooks.next_delivery(engine, target)
    assert d2 is not None and d2.job == second and d2.cursor > d.cursor
    assert not webhooks.delivered(engine, d, "s1", 204, 30.0)
    assert webhooks.delivered(engine, d2, "s1", 200, 30.0)
    assert webhooks.next_delivery(engine, target) is None
    row = one_target(engine)
    assert (row["cursor"], row["lag"], row["delivered"], row["last_status"]) == (d2.cursor, 0, 2, 200)


def test_one_deliverer_holds_a_target_and_one_that_lost_its_lease_records_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a finished job and a target claimed by sweeper s1
    finish_job(engine, tmp_path, "a")
    target = webhooks.target_of(URL)
    webhooks.ensure(engine, target, "127.0.0.1:9")
    assert webhooks.claim(engine, target, "s1", 30.0)
    # Then another fleet's sweeper cannot take it while the lease runs, and s1 renews it
    assert not webhooks.claim(engine, target, "s2", 30.0)
    assert webhooks.claim(engine, target, "s1", 30.0)
    d = webhooks.next_delivery(engine, target)
    assert d is not None
    # When s1's lease expires (it froze mid-delivery) and s2 takes the target
    with engine.begin() as conn:
        conn.execute(update(WebhookState).values(lease_expires_at=WebhookState.lease_expires_at - 60))
    assert webhooks.claim(engine, target, "s2", 30.0)
    # Then s1's late record changes nothing: the event is s2's to send again
    assert not webhooks.delivered(engine, d, "s1", 200, 30.0)
    webhooks.failed(engine, d, "s1", 500, "HTTP 500", base=1.0, cap=10.0)
    row = one_target(engine)
    assert (row["cursor"], row["delivered"], row["failures"], row["owner"]) == (0, 0, 0, "s2")
    assert webhooks.next_delivery(engine, target) == d
    assert webhooks.delivered(engine, d, "s2", 200, 30.0)
    # And a released target is free for the next claim
    webhooks.release(engine, target, "s2")
    assert webhooks.claim(engine, target, "s3", 30.0)


def test_a_failed_attempt_is_counted_and_the_next_waits_a_capped_exponential_backoff(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a finished job and its target
    job = finish_job(engine, tmp_path, "a")
    target = webhooks.target_of(URL)
    webhooks.ensure(engine, target, "127.0.0.1:9")
    assert webhooks.claim(engine, target, "s1", 30.0)
    d = webhooks.next_delivery(engine, target)
    assert d is not None and d.attempts == 0
    # When the receiver answers 503
    delay = webhooks.failed(engine, d, "s1", 503, "HTTP 503", base=60.0, cap=600.0)
    # Then the attempt is counted and the event is not due before the backoff
    assert delay == 60.0
    row = one_target(engine)
    assert (row["attempts"], row["failures"], row["last_status"], row["last_error"]) == (
        1,
        1,
        503,
        "HTTP 503",
    )
    assert row["cursor"] == 0 and row["lag"] == 1
    assert webhooks.next_delivery(engine, target) is None
    # When the backoff has passed
    with engine.begin() as conn:
        conn.execute(update(WebhookState).values(next_attempt_at=WebhookState.next_attempt_at - 120))
    again = webhooks.next_delivery(engine, target)
    # Then the same event is due, with its attempts, and a further failure waits twice as long
    assert again is not None and again.job == job and again.attempts == 1
    assert webhooks.failed(engine, again, "s1", None, "no answer", base=60.0, cap=600.0) == 120.0
    # And the backoff doubles up to its cap
    assert [webhooks.backoff(n, 1.0, 10.0) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    # And a delivery starts the attempts again
    with engine.begin() as conn:
        conn.execute(update(WebhookState).values(next_attempt_at=0))
    last = webhooks.next_delivery(engine, target)
    assert last is not None and last.attempts == 2
    assert webhooks.delivered(engine, last, "s1", 200, 30.0)
    row = one_target(engine)
    assert (row["attempts"], row["failures"], row["delivered"], row["last_error"]) == (0, 2, 1, None)


def test_each_targets_delivery_state_is_in_the_api_and_the_metrics(
    engine: Engine, redis_url: str, tmp_path: Path
) -> None:
    # Given a target that delivered one job's finish, failed once at the next, and has one more behind
    for name in ("a", "b", "c"):
        finish_job(engine, tmp_path, name)
    target = webhooks.target_of(URL)
    webhooks.ensure(engine, target, "127.0.0.1:9")
    assert webhooks.claim(engine, target, "s1", 30.0)
    d = webhooks.next_delivery(engine, target)
    assert d is not None and webhooks.delivered(engine, d, "s1", 200, 30.0)
    d = webhooks.next_delivery(engine, target)
    assert d is not None
    webhooks.failed(engine, d, "s1", 502, "HTTP 502", base=60.0, cap=60.0)
    env = {
        "PHOTOJOBS_DATABASE_URL": str(engine.url),
        "PHOTOJOBS_REDIS_URL": redis_url,
        "PHOTOJOBS_WEBHOOK_URL": URL,
        "PHOTOJOBS_WEBHOOK_SECRET": "k",
    }
    client = Client(Settings.from_env(env), engine, migrate=False)
    # When the API and the metrics are read
    app = create_app(client, token=TOKEN, photo_roots=[tmp_path], env=env)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        answer = http.get("/api/webhooks")
        scrape = parse_scrape(http.get("/metrics").text)
    # Then the API shows the configured target (its host, never the URL) and its state
    assert answer.status_code == 200
    body = answer.json()
    assert body["configured"] == {"host": "127.0.0.1:9", "target": target}
    (row,) = body["webhooks"]
    assert URL not in answer.text
    assert (row["delivered"], row["failures"], row["lag"], row["attempts"]) == (1, 1, 2, 1)
    assert (row["last_status"], row["last_error"], row["owner"]) == (502, "HTTP 502", "s1")
    # And the metrics count the deliveries and the failures, and the lag in events
    labels = {"host": "127.0.0.1:9", "target": target[:12]}
    assert sample(scrape, "photojobs_webhook_deliveries_total", **labels) == 1
    assert sample(scrape, "photojobs_webhook_failures_total", **labels) == 1
    assert sample(scrape, "photojobs_webhook_lag_events", **labels) == 2
