"""The worker registry (``store.workers``) and its view (``store.listing.workers``), with the
sweeper forgetting dead workers, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from photojobs.maintenance import sweep_once
from store import workers as store_workers
from store.clock import db_now
from store.dispatch import Publish
from store.lanes import all_lanes
from store.listing import workers
from store.models import Worker


class NoPublisher:
    def publish(self, items: list[Publish]) -> None:
        assert not items

    def holds(self, item: Publish) -> bool:
        return True


def _age(engine: Engine, worker_id: str, seconds: float) -> None:
    """Move a worker's last beat ``seconds`` into the past (as if its beats had stopped)."""
    with Session(engine) as s, s.begin():
        s.execute(update(Worker).where(Worker.id == worker_id).values(last_beat=db_now() - seconds))


def _rows(engine: Engine) -> dict[str, Worker]:
    with Session(engine) as s:
        return {w.id: w for w in s.execute(select(Worker)).scalars()}


def test_a_beat_is_one_row_per_worker_refreshed_in_place(engine: Engine) -> None:
    # Given a worker that beats at boot (idle) and again later holding two items
    store_workers.beat(engine, "host-a:101:abc123", lanes=["exif", "analysis"], interval=0.5, held=0)
    first = _rows(engine)["host-a:101:abc123"]
    started, beat1 = first.started_at, first.last_beat
    store_workers.beat(engine, "host-a:101:abc123", lanes=["exif", "analysis"], interval=0.5, held=2)
    # Then there is one row: started_at kept, last beat moved on, items held updated
    rows = _rows(engine)
    assert list(rows) == ["host-a:101:abc123"]
    row = rows["host-a:101:abc123"]
    assert row.started_at == started and row.last_beat >= beat1 and row.items_held == 2
    assert (row.host, row.pid, row.lanes, row.stopped_at) == ("host-a", 101, ["analysis", "exif"], None)
    # And the view lists it live, idle (no running lease), with its lanes and a fresh heartbeat
    [w] = workers(engine)
    assert w["state"] == "live" and w["id"] == "host-a:101:abc123" and w["pid"] == 101
    assert w["lanes"] == ["analysis", "exif"] and w["held"] == 0 and w["items_held"] == 2
    assert w["heartbeat_age"] is not None and w["heartbeat_age"] < 60


def test_stale_and_stopped_workers_are_marked(engine: Engine) -> None:
    # Given three workers: one beating, one whose beats stopped 10 intervals ago, one stopped cleanly
    for wid in ("h:1:aaaaaa", "h:2:bbbbbb", "h:3:cccccc"):
        store_workers.beat(engine, wid, lanes=["noop"], interval=0.5, held=0)
    _age(engine, "h:2:bbbbbb", 30)
    assert store_workers.mark_stopped(engine, "h:3:cccccc")
    # When a late beat of the stopped one arrives after its stop mark
    store_workers.beat(engine, "h:3:cccccc", lanes=["noop"], interval=0.5, held=0)
    # Then the view says live, stale, stopped (live first) and the late beat did not revive it
    states = [(w["id"], w["state"]) for w in workers(engine)]
    assert states == [("h:1:aaaaaa", "live"), ("h:2:bbbbbb", "stale"), ("h:3:cccccc", "stopped")]
    assert not store_workers.mark_stopped(engine, "h:9:unknown")


def test_the_sweeper_forgets_workers_not_heard_from_for_the_retention_age(engine: Engine) -> None:
    # Given a live worker, one silent for 2 minutes and one stopped an hour and a half ago
    for wid in ("h:1:aaaaaa", "h:2:bbbbbb", "h:3:cccccc"):
        store_workers.beat(engine, wid, lanes=["noop"], interval=0.5, held=0)
    store_workers.mark_stopped(engine, "h:3:cccccc")
    _age(engine, "h:2:bbbbbb", 120)
    _age(engine, "h:3:cccccc", 5400)
    specs = all_lanes({})
    # When the sweeper runs with the default retention (1 hour)
    report = sweep_once(engine, specs, NoPublisher())
    # Then only the worker silent for longer than an hour is gone
    assert report.workers_forgotten == 1 and not report.errors
    assert sorted(_rows(engine)) == ["h:1:aaaaaa", "h:2:bbbbbb"]
    # When it runs with a retention of one minute
    report = sweep_once(engine, specs, NoPublisher(), forget_workers_after=60)
    # Then the silent one is forgotten too, the live one stays
    assert report.workers_forgotten == 1 and sorted(_rows(engine)) == ["h:1:aaaaaa"]


def test_a_retention_age_must_be_positive(engine: Engine) -> None:
    # Given / When a zero retention / Then a clear error, nothing deleted
    store_workers.beat(engine, "h:1:aaaaaa", lanes=["noop"], interval=0.5, held=0)
    with pytest.raises(ValueError, match="older_than must be positive"):
        store_workers.forget_stale(engine, 0)
    assert list(_rows(engine)) == ["h:1:aaaaaa"]
