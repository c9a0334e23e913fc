"""``/metrics`` of a real ``photojobs serve`` process over real work (a worker process, noop jobs), on
SQLite and PostgreSQL: no counter goes back after a retry or a prune, the counters are the events
folded, and every metric the Grafana dashboard plots is in the scrape."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from store.engine import make_engine
from store.models import Event
from store.retention import prune
from tests.metrics_support import (
    Sample,
    counters_of,
    dashboard_exprs,
    load_dashboard,
    metric_names,
    parse_scrape,
    sample,
)
from tests.support import Fleet, make_files, wait_for
from tests.web_support import WebServer, serving, wait_job

FINAL = {"succeeded", "failed", "partial", "cancelled"}


@pytest.fixture
def server(env: dict[str, str], tmp_path: Path, photos: Path) -> Iterator[WebServer]:
    with serving(env, tmp_path, [photos]) as srv:
        yield srv


def _scrape(http: httpx.Client) -> dict[Sample, float]:
    r = http.get("/metrics")
    assert r.status_code == 200, r.text
    return parse_scrape(r.text)


def _folded_events(db_url: str, through: float) -> dict[Sample, float]:
    """The store's numbered events up to cursor ``through``, as ``photojobs_events_total`` samples."""
    engine = make_engine(db_url)
    try:
        with Session(engine) as s:
            rows = s.execute(
                select(Event.type, func.coalesce(Event.lane, ""), func.count())
                .where(Event.seq.is_not(None), Event.seq <= through)
                .group_by(Event.type, Event.lane)
            ).all()
    finally:
        engine.dispose()
    tally: Tally[Sample] = Tally()
    for type_, lane, n in rows:
        tally[("photojobs_events_total", tuple(sorted({"type": type_, "lane": lane}.items())))] += n
    return {k: float(v) for k, v in tally.items()}


def _events_total(scrape: dict[Sample, float]) -> dict[Sample, float]:
    return {k: v for k, v in scrape.items() if k[0] == "photojobs_events_total"}


def _went_back(
    before: dict[Sample, float], after: dict[Sample, float]
) -> dict[Sample, tuple[float, float | None]]:
    """The counters of ``before`` that are lower (or missing) in ``after``."""
    return {k: (v, after.get(k)) for k, v in counters_of(before).items() if k not in after or after[k] < v}


def test_no_counter_goes_back_after_a_retry_or_a_prune(
    server: WebServer, fleet: Fleet, photos: Path, db_url: str
) -> None:
    # Given a serve process, a noop worker with one attempt per item and a sweeper
    fleet.start_worker(["noop"], env={"PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS": "1"})
    fleet.start_sweeper()
    make_files(photos / "good", 5)
    make_files(photos / "bad", 2, prefix="broken")
    http = server.client()
    # When a job of 5 good and 2 failing items runs and /metrics is scraped
    job = http.post(
        "/api/jobs", json={"lanes": ["noop"], "paths": ["good", "bad"], "params": {"noop.fail_if": "broken"}}
    ).json()["job"]
    assert wait_job(http, job)["state"] == "partial"
    first = _scrape(http)
    # Then the counters count the work by lane, and they are the events folded so far
    assert sample(first, "photojobs_items_succeeded_total", lane="noop") == 5
    assert sample(first, "photojobs_items_failed_total", lane="noop") == 2
    assert sample(first, "photojobs_claims_total", lane="noop") >= 7
    assert sample(first, "photojobs_jobs_submitted_total") == 1
    assert _events_total(first) == _folded_events(db_url, sample(first, "photojobs_counters_cursor"))
    # And each of the 7 attempts is in the run-time and queue-wait histograms, the job's duration once
    assert sample(first, "photojobs_item_run_seconds_count", lane="noop") == 7
    assert sample(first, "photojobs_item_queue_wait_seconds_count", lane="noop") == 7
    assert sample(first, "photojobs_job_duration_seconds_count") == 1
    # When the failed items are retried (and fail again)
    assert http.post(f"/api/jobs/{job}/retry", params={"lane": "noop"}).json()["changed"] == 2
    wait_for(
        lambda: sample(_scrape(http), "photojobs_items_failed_total", lane="noop") == 4,
        60,
        0.2,
        what="the retried items to fail again",
    )
    second = _scrape(http)
    # Then nothing went back: the failures stay counted, the retries are counted too
    assert _went_back(first, second) == {}
    assert sample(second, "photojobs_items_retried_total", lane="noop") == 2
    assert sample(second, "photojobs_items_failed_total", lane="noop") == 4
    # When a newer job runs, then everything prunable is pruned (the first job and its events)
    (photos / "later").mkdir()
    (photos / "later" / "one.txt").write_text("one")
    newer = http.post("/api/jobs", json={"lanes": ["noop"], "paths": ["later"]}).json()["job"]
    assert wait_job(http, newer)["state"] == "succeeded"
    before = _scrape(http)
    assert _events_total(before) == _folded_events(db_url, sample(before, "photojobs_counters_cursor"))
    engine = make_engine(db_url)
    try:
        pruned = prune(engine, 0)
        with Session(engine) as s:
            left = s.execute(select(func.count()).where(Event.job_id == job)).scalar_one()
    finally:
        engine.dispose()
    assert pruned.jobs == 1 and pruned.events > 0 and left == 0
    after = _scrape(http)
    # Then no counter went back, and the work counted is still all there
    assert _went_back(before, after) == {}
    assert sample(after, "photojobs_items_succeeded_total", lane="noop") == 6
    assert sample(after, "photojobs_items_failed_total", lane="noop") == 4
    assert sample(after, "photojobs_jobs_submitted_total") == 2
    # And the gauges of the fleet are there: a live worker on noop, the build, an empty lane
    wait_for(
        lambda: sample(_scrape(http), "photojobs_workers", state="live") >= 1, 30, 0.2, what="a live worker"
    )
    assert sample(after, "photojobs_lane_depth", lane="noop", state="pending") == 0
    assert sample(after, "photojobs_oldest_queued_age_seconds", lane="noop") == 0
    assert [k for k in after if k[0] == "photojobs_build_info"]
    # And every metric the Grafana dashboard plots is in this real scrape
    names = {name for name, _ in after}
    assert metric_names(dashboard_exprs(load_dashboard())) - names == set()
