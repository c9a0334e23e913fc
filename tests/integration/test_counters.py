"""Persisted counters (store/counters.py) and the /metrics gauges, on SQLite and PostgreSQL: a prune
never takes from a counter, racing folds count each event once, the gauges read the right figures
through index searches."""

from __future__ import annotations

import platform
import threading
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

import photojobs
from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing import scale
from photojobs.web import metrics as web_metrics
from store import counters, retention
from store import jobs as store_jobs
from store import workers as store_workers
from store.clock import db_now
from store.events import assign_cursors, emit_many
from store.lanes import all_lanes
from store.listing import depth_query, oldest_queued_query
from store.models import Event, Item, Worker
from tests.metrics_support import parse_scrape, sample

SPECS = all_lanes({})


def _submit(engine: Engine, tmp: Path, n: int, lane: str = "noop") -> int:
    photos = [store_jobs.PhotoInput(str(tmp / f"{lane}-{i}.jpg")) for i in range(n)]
    return store_jobs.submit(engine, [SPECS[lane]], photos).job_id


def _event_tally(engine: Engine) -> Tally[tuple[str, str]]:
    """The numbered events in the store by (type, lane)."""
    with Session(engine) as s:
        rows = s.execute(
            select(Event.type, func.coalesce(Event.lane, ""), func.count())
            .where(Event.seq.is_not(None))
            .group_by(Event.type, Event.lane)
        ).all()
    return Tally({(t, lane): n for t, lane, n in rows})


def _finish(engine: Engine, job: int, state: str, event: str) -> None:
    """Every item of the job ends in ``state``, each with its ``event`` (as a worker's finish writes)."""
    with Session(engine) as s, s.begin():
        rows = s.execute(
            update(Item).where(Item.job_id == job).values(state=state).returning(Item.id, Item.lane)
        ).all()
        emit_many(s, [{"type": event, "job_id": job, "item_id": r.id, "lane": r.lane} for r in rows])


def test_a_prune_folds_before_it_deletes_so_no_counter_loses_an_event(engine: Engine, tmp_path: Path) -> None:
    # Given a finished job (4 succeeded, with their events) and a newer one, and no fold yet
    job = _submit(engine, tmp_path, 4)
    _finish(engine, job, "succeeded", "item_succeeded")
    _submit(engine, tmp_path, 1, lane="analysis")
    assign_cursors(engine)
    expected = _event_tally(engine)
    assert counters.read(engine).values == {}
    # When everything prunable is pruned
    pruned = retention.prune(engine, 0)
    # Then the job's events are gone from the store...
    assert pruned.jobs == 1 and pruned.events > 0
    with Session(engine) as s:
        assert s.execute(select(func.count()).where(Event.job_id == job)).scalar_one() == 0
    # ...and every one of them is in the counters, counted once (a fold after the prune adds nothing)
    assert counters.fold(engine) == 0
    folded = counters.read(engine)
    assert folded.values == dict(expected)
    assert folded.get("item_succeeded", "noop") == 4 and folded.get("job_submitted") == 2
    with Session(engine) as s:
        assert folded.cursor == s.execute(select(func.max(Event.seq))).scalar_one()


def test_an_event_numbered_after_the_prunes_first_fold_is_folded_before_it_is_deleted(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a finished job and a newer one, and a late event of the finished job that is committed
    # and numbered just after the prune's first fold (before its delete transactions)
    job = _submit(engine, tmp_path, 2)
    _finish(engine, job, "succeeded", "item_succeeded")
    _submit(engine, tmp_path, 1, lane="analysis")
    first_fold = retention.fold

    def fold_then_a_late_event(engine_: Engine, *, number: bool = True) -> int:
        n = first_fold(engine_, number=number)
        with Session(engine_) as s, s.begin():
            emit_many(s, [{"type": "stale_commit_rejected", "job_id": job, "lane": "noop"}])
            emit_many(s, [{"type": "job_pause_requested"}])  # newest: the one event a prune keeps
        assign_cursors(engine_)
        return n

    monkeypatch.setattr(retention, "fold", fold_then_a_late_event)
    # When everything prunable is pruned
    assert retention.prune(engine, 0).jobs == 1
    # Then the late event was deleted with its job, and counted before that
    with Session(engine) as s:
        assert s.execute(select(func.count()).where(Event.job_id == job)).scalar_one() == 0
    counters.fold(engine)
    assert counters.read(engine).get("stale_commit_rejected", "noop") == 1


def test_folds_racing_with_each_other_new_events_and_a_prune_count_each_event_once(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given 600 numbered events and folds of 7 events a transaction (many interleavings)
    monkeypatch.setattr(counters, "FOLD_BATCH", 7)
    kinds = [("item_succeeded", "noop"), ("item_failed", "noop"), ("item_claimed", "analysis")]
    emitted: Tally[tuple[str, str]] = Tally()

    def emit_batch(i: int) -> None:
        rows = [{"type": kinds[(i + k) % 3][0], "lane": kinds[(i + k) % 3][1]} for k in range(20)]
        with Session(engine) as s, s.begin():
            emit_many(s, rows)
        emitted.update((r["type"], r["lane"]) for r in rows)

    for i in range(30):
        emit_batch(i)
    assign_cursors(engine)
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def run(work: Any) -> None:
        try:
            barrier.wait(timeout=60)
            work()
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    def emitter() -> None:
        for i in range(30, 40):
            emit_batch(i)
            assign_cursors(engine)

    def pruner() -> None:
        for _ in range(3):
            retention.prune(engine, 0)

    # When 4 folds, an emitter (200 more events) and a pruner start together
    threads = [threading.Thread(target=run, args=(lambda: counters.fold(engine),)) for _ in range(4)]
    threads += [threading.Thread(target=run, args=(emitter,)), threading.Thread(target=run, args=(pruner,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    counters.fold(engine)
    # Then every event was counted exactly once, though the prune deleted most of them
    folded = counters.read(engine)
    assert folded.values == dict(emitted)
    assert sum(emitted.values()) == 800
    with Session(engine) as s:
        left = s.execute(select(func.count()).select_from(Event)).scalar_one()
        assert folded.cursor == s.execute(select(func.max(Event.seq))).scalar_one()
    assert left < 800  # the prune did delete events while the folds ran


def test_the_gauges_of_a_scrape(engine: Engine, db_url: str, tmp_path: Path) -> None:
    # Given 6 noop items: 3 pending, 2 queued (the oldest 100 s ago), 1 running
    job = _submit(engine, tmp_path, 6)
    with Session(engine) as s, s.begin():
        ids = list(s.execute(select(Item.id).where(Item.job_id == job).order_by(Item.id)).scalars())
        s.execute(update(Item).where(Item.id.in_(ids[3:5])).values(state="queued", queued_at=db_now() - 100))
        s.execute(update(Item).where(Item.id == ids[4]).values(queued_at=db_now() - 10))
        s.execute(update(Item).where(Item.id == ids[5]).values(state="running"))
    # And three workers: one live (noop, analysis), one whose beats stopped, one stopped cleanly
    store_workers.beat(engine, "h:1:a", lanes=["noop", "analysis"], interval=0.5, held=1)
    store_workers.beat(engine, "h:2:b", lanes=["noop"], interval=0.5, held=0)
    store_workers.beat(engine, "h:3:c", lanes=["exif"], interval=0.5, held=0)
    with Session(engine) as s, s.begin():
        s.execute(update(Worker).where(Worker.id == "h:2:b").values(last_beat=0.0))
    store_workers.mark_stopped(engine, "h:3:c")
    client = Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": db_url}, tmp_path), engine, migrate=False)
    # When /metrics is rendered
    scrape = parse_scrape(web_metrics.render(client).decode())
    # Then the lane depth, the oldest queued age and the workers are as set up
    assert [
        sample(scrape, "photojobs_lane_depth", lane="noop", state=st)
        for st in ("pending", "queued", "running")
    ] == [
        3,
        2,
        1,
    ]
    assert sample(scrape, "photojobs_lane_depth", lane="analysis", state="pending") == 0
    assert 100 <= sample(scrape, "photojobs_oldest_queued_age_seconds", lane="noop") < 100 + 600
    assert sample(scrape, "photojobs_oldest_queued_age_seconds", lane="analysis") == 0
    assert {st: sample(scrape, "photojobs_workers", state=st) for st in ("live", "stale", "stopped")} == {
        "live": 1,
        "stale": 1,
        "stopped": 1,
    }
    assert sample(scrape, "photojobs_lane_workers", lane="noop") == 1
    assert sample(scrape, "photojobs_lane_workers", lane="analysis") == 1
    assert sample(scrape, "photojobs_lane_workers", lane="exif") == 0
    build = {
        "version": photojobs.__version__,
        "dramatiq": dramatiq.__version__,
        "python": platform.python_version(),
    }
    assert sample(scrape, "photojobs_build_info", **build) == 1
    # And the counters are the events folded: 6 items created, 1 job submitted
    assert sample(scrape, "photojobs_events_total", type="item_created", lane="noop") == 6
    assert sample(scrape, "photojobs_jobs_submitted_total") == 1
    assert sample(scrape, "photojobs_items_succeeded_total", lane="noop") == 0


def test_the_gauges_read_the_active_items_not_the_history_at_100k_items(engine: Engine) -> None:
    # Given 1,000 pending noop items behind a finished job of 100k (a store's history)
    scale.seed_pending(engine, 1_000, jobs=4, finished=100_000)
    # When the database plans the lane gauges' statements
    plans = {
        "depth": scale.plan(engine, depth_query("noop")),
        "oldest queued": scale.plan(engine, oldest_queued_query("noop")),
    }
    # Then neither reads all of items: each is a search of an index by lane and state
    assert {k: scale.full_scans(v) for k, v in plans.items() if scale.full_scans(v)} == {}, plans
