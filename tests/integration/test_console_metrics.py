"""The duration histograms and the lane gauges of ``/metrics`` (issue 33) on SQLite and PostgreSQL,
through real claims and finishes of the store: run time (claim -> finish), queue wait (ready ->
claim) and job duration land in the right buckets once each; a paused lane with ready work shows in
``photojobs_oldest_pending_age_seconds`` and ``photojobs_lane_paused``, and the README's alert
rules fire for it (and not for a lane with nothing to do)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.web import metrics as web_metrics
from store import counters, lane_control
from store import items as store_items
from store import jobs as store_jobs
from store.clock import db_now
from store.fencing import fenced
from store.lanes import all_lanes
from store.models import Item
from tests.alert_rules import evaluate, instant, readme_rules
from tests.metrics_support import parse_scrape, sample

SPECS = all_lanes({})
NOOP = SPECS["noop"]


def _submit(engine: Engine, tmp: Path, n: int, lane: str = "noop") -> int:
    photos = [store_jobs.PhotoInput(str(tmp / f"{lane}-{i}.jpg")) for i in range(n)]
    return store_jobs.submit(engine, [SPECS[lane]], photos).job_id


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        return list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())


def _ready_ago(engine: Engine, job: int, seconds: float) -> None:
    """The job's unclaimed items became ready ``seconds`` ago (database clock)."""
    with Session(engine) as s, s.begin():
        s.execute(
            update(Item)
            .where(Item.job_id == job, Item.state.in_(("pending", "queued")))
            .values(updated_at=db_now() - seconds)
        )


def _scrape(engine: Engine, db_url: str, tmp_path: Path) -> dict:  # type: ignore[type-arg]
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": db_url}, tmp_path), engine, migrate=False)
    return parse_scrape(web_metrics.render(client).decode())


def _bucket(scrape: dict, metric: str, le: str, **labels: str) -> float:  # type: ignore[type-arg]
    return sample(scrape, f"{metric}_bucket", le=le, **labels)


def test_run_time_queue_wait_and_job_duration_land_in_their_buckets_once(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    # Given a job of three noop items that became ready 7 s ago
    job = _submit(engine, tmp_path, 3)
    _ready_ago(engine, job, 7.0)
    # When each is claimed; the first runs 2 s (its claim 2 s earlier), the second fails once
    # (retry scheduled) and then succeeds, the third succeeds at once
    first, second, third = _items(engine, job)
    lease = store_items.claim(engine, NOOP, first.id, 0, "w").lease
    assert lease is not None and lease.claimed_at is not None and lease.ready_at is not None
    with fenced(engine, first.id, lease.token) as s:
        store_items.succeed(s, replace(lease, claimed_at=lease.claimed_at - 2.0), None, "w")
    lease = store_items.claim(engine, NOOP, second.id, 0, "w").lease
    assert lease is not None
    with fenced(engine, second.id, lease.token) as s:
        store_items.fail(s, NOOP, lease, "RuntimeError: once", "w", trace="Traceback ...")
    with Session(engine) as s, s.begin():  # its backoff over at once
        s.execute(update(Item).where(Item.id == second.id).values(not_before=0.0))
    again = store_items.claim(engine, NOOP, second.id, lease.token, "w").lease
    assert again is not None
    with fenced(engine, second.id, again.token) as s:
        store_items.succeed(s, again, None, "w")
    lease = store_items.claim(engine, NOOP, third.id, 0, "w").lease
    assert lease is not None
    with fenced(engine, third.id, lease.token) as s:
        store_items.succeed(s, lease, None, "w")
    scrape = _scrape(engine, db_url, tmp_path)
    run, wait, dur = (
        "photojobs_item_run_seconds",
        "photojobs_item_queue_wait_seconds",
        "photojobs_job_duration_seconds",
    )
    # Then four attempts ran (one failed with a retry scheduled): the 2 s one in (1, 2.5]
    assert sample(scrape, f"{run}_count", lane="noop") == 4
    assert _bucket(scrape, run, "1.0", lane="noop") == 3
    assert _bucket(scrape, run, "2.5", lane="noop") == 4
    assert 2.0 <= sample(scrape, f"{run}_sum", lane="noop") < 3.5
    # And four claims waited: three ~7 s since ready (in (5, 10]), the retry's claim under 5 s
    assert sample(scrape, f"{wait}_count", lane="noop") == 4
    assert _bucket(scrape, wait, "5.0", lane="noop") == 1
    assert _bucket(scrape, wait, "10.0", lane="noop") == 4
    # And the job, settled, is observed once; its duration from submission
    assert sample(scrape, f"{dur}_count") == 1
    assert _bucket(scrape, dur, "60.0") == 1
    # And every lane is listed (zeros before its first observation)
    assert sample(scrape, f"{run}_count", lane="exif") == 0
    # And the console's Lanes page shows p50 and p95 from the same buckets, interpolated as
    # Prometheus's histogram_quantile does: the run's p95 within (1, 2.5], its p50 in the first
    # bucket; the waits' p50 and p95 within (5, 10]; "no attempt yet" for a lane without one
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": db_url}, tmp_path), engine, migrate=False)
    lanes = {entry["lane"]: entry for entry in client.lane_overview()["lanes"]}
    noop = lanes["noop"]
    assert noop["run"]["count"] == 4 and noop["run"]["p50"] <= 0.05
    assert noop["run"]["p95"] == pytest.approx(1 + 1.5 * 0.8)
    assert noop["wait"]["p50"] == pytest.approx(5 + 5 * 1 / 3)
    assert noop["wait"]["p95"] == pytest.approx(5 + 5 * 2.8 / 3)
    assert lanes["exif"]["run"] == {"p50": None, "p95": None, "count": 0}
    # When the store is scraped again and an unrelated event is folded
    counters.fold(engine)
    again_scrape = _scrape(engine, db_url, tmp_path)
    # Then nothing is observed twice
    assert sample(again_scrape, f"{dur}_count") == 1
    assert sample(again_scrape, f"{run}_count", lane="noop") == 4


def test_a_paused_lane_with_ready_work_fires_the_readme_alerts(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    # Given a noop job of 40 items ready for 20 minutes and a paused noop lane, no worker, and an
    # analysis lane with nothing to do
    job = _submit(engine, tmp_path, 40)
    _ready_ago(engine, job, 1200.0)
    lane_control.pause_lane(engine, "noop", by="test")
    # And a worker got the first item's message during the pause: its claim was deferred
    first = _items(engine, job)[0]
    refused = store_items.claim(engine, NOOP, first.id, 0, "w")
    assert refused.lease is None and refused.refusal is not None and refused.refusal.name == "LANE_PAUSED"
    # When /metrics is scraped
    scrape = _scrape(engine, db_url, tmp_path)
    # Then the gauges say so
    assert sample(scrape, "photojobs_lane_paused", lane="noop") == 1
    assert sample(scrape, "photojobs_lane_paused", lane="analysis") == 0
    assert sample(scrape, "photojobs_oldest_pending_age_seconds", lane="noop") >= 1200
    assert sample(scrape, "photojobs_oldest_pending_age_seconds", lane="analysis") == 0
    # And the README's lane alerts fire for noop, not for analysis
    rules = {r["alert"]: r["expr"] for r in readme_rules()}
    for name in ("PhotojobsLaneStuck", "PhotojobsLanePaused", "PhotojobsLaneWithoutWorkers"):
        assert instant(rules[name])
        assert evaluate(rules[name], scrape) == {("noop",)}, name
    assert evaluate(rules["PhotojobsStaleWorkers"], scrape) == set()
    # When the lane is resumed and its work is young again
    lane_control.resume_lane(engine, "noop", by="test")
    _ready_ago(engine, job, 1.0)
    scrape = _scrape(engine, db_url, tmp_path)
    # Then the stuck and paused alerts are quiet (no worker still fires its own alert)
    assert evaluate(rules["PhotojobsLaneStuck"], scrape) == set()
    assert evaluate(rules["PhotojobsLanePaused"], scrape) == set()
    assert evaluate(rules["PhotojobsLaneWithoutWorkers"], scrape) == {("noop",)}


def test_a_job_folded_over_several_batches_is_observed_once(
    engine: Engine, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job of four items run to the end before any fold, and folds of 3 events at a time
    job = _submit(engine, tmp_path, 4)
    for item in _items(engine, job):
        lease = store_items.claim(engine, NOOP, item.id, 0, "w").lease
        assert lease is not None
        with fenced(engine, item.id, lease.token) as s:
            store_items.succeed(s, lease, None, "w")
    monkeypatch.setattr(counters, "FOLD_BATCH", 3)
    # When the log is folded (batches that see the job settled before its last event is folded)
    scrape = _scrape(engine, db_url, tmp_path)
    # Then the job's duration is observed once, by the batch holding its last settling event
    assert sample(scrape, "photojobs_job_duration_seconds_count") == 1
    assert sample(scrape, "photojobs_item_run_seconds_count", lane="noop") == 4


def test_the_items_of_batch_messages_land_in_the_run_time_and_queue_wait_histograms(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    # Given three noop items and two analysis items that became ready 7 s ago, dispatched as batch
    # messages (a lane's first attempts ride in batches: most items of a big job)
    from store.dispatch import take_for_dispatch
    from store.fencing import fenced_batch
    from store.intents import set_photo_hash
    from store.photo_locks import SHARED, LockRequest

    analysis = SPECS["analysis"]
    jobs = {"noop": _submit(engine, tmp_path, 3), "analysis": _submit(engine, tmp_path, 2, "analysis")}
    for lane, job in jobs.items():
        take_for_dispatch(engine, SPECS[lane])
        _ready_ago(engine, job, 7.0)
    # When each lane's items are claimed as one batch and finished together: the noop items by
    # the plain successes' one statement, the analysis items each with its photo's hash
    for lane, job in jobs.items():
        spec, items = SPECS[lane], _items(engine, job)
        request = LockRequest(SHARED, 0.5) if spec is analysis else None
        requests = dict.fromkeys([i.id for i in items], request)
        pairs = [(i.id, i.fencing_token) for i in items]
        outcomes = store_items.claim_batch(engine, spec, pairs, "w", requests)
        leases = [o.lease for o in outcomes if o.lease is not None]
        assert len(leases) == len(items)
        with fenced_batch(engine, [x.item_id for x in leases]) as s:
            store_items.lock_batch_finish(s, leases)
            if spec is analysis:
                for x in leases:
                    write = [lambda s, p=x.photo_id: set_photo_hash(s, p, "ab" * 32, 1)]
                    store_items.succeed(s, x, {"ok": 1}, "w", write)
            else:
                store_items.succeed_many(s, [(x, None) for x in leases], "w")
    scrape = _scrape(engine, db_url, tmp_path)
    run, wait = "photojobs_item_run_seconds", "photojobs_item_queue_wait_seconds"
    # Then every item's run is observed, in the first bucket, and every claim's wait of ~7 s
    for lane, n in (("noop", 3), ("analysis", 2)):
        assert sample(scrape, f"{run}_count", lane=lane) == n, lane
        assert _bucket(scrape, run, "1.0", lane=lane) == n, lane
        assert sample(scrape, f"{wait}_count", lane=lane) == n, lane
        assert _bucket(scrape, wait, "5.0", lane=lane) == 0 and _bucket(scrape, wait, "10.0", lane=lane) == n
