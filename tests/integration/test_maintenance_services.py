"""The sweeper's maintenance services (``photojobs.maintenance``) on SQLite and PostgreSQL: each runs
once and does its duty; the loop runs them in one pass, keeps each one's interval, and one failing
service does not stop the others."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from photojobs.config import Settings
from photojobs.maintenance import (
    DispatchLane,
    EndAbandonedSubmissions,
    ForgetIdempotencyKeys,
    ForgetWorkers,
    Maintenance,
    NumberEvents,
    RemoveStrayStaged,
    Republish,
    RevokeExpired,
    Service,
    SettleOrphans,
    VacuumTables,
    default_services,
)
from photojobs.sweeper_service import Sweeper
from photos import fileops
from store import items as store_items
from store import jobs as store_jobs
from store import workers as store_workers
from store.clock import db_now
from store.dispatch import Publish, take_for_dispatch
from store.lanes import lane_spec
from store.models import Event, Intent, Item, Worker
from store.sweeper import revoke_expired
from tests.support import expire_running_leases, items_of, record_staged_edit

NOOP = replace(lane_spec("noop", env={}), max_attempts=2, threads=1, fleet_processes=1, batch=16)
EXIF = lane_spec("exif", env={})


class RecordingPublisher:
    """Keeps what the services publish; holds no message (every stale message counts as lost)."""

    def __init__(self) -> None:
        self.published: list[Publish] = []

    def publish(self, items: list[Publish]) -> None:
        self.published += items

    def held(self, items: list[Publish]) -> set[str]:
        return set()


class BrokenPublisher(RecordingPublisher):
    """Redis is down: publishing any message fails (an empty publish sends nothing)."""

    def publish(self, items: list[Publish]) -> None:
        if items:
            raise ConnectionError("redis is down")


def _submit(engine: Engine, tmp_path: Path, n: int, spec=NOOP, roots: list[str] | None = None) -> int:  # type: ignore[no-untyped-def]
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(n)]
    return store_jobs.submit(engine, [spec], photos, roots=roots or []).job_id


def _states(engine: Engine, job_id: int) -> list[str]:
    return [i.state for i in items_of(engine, job_id)]


def _unnumbered_events(engine: Engine) -> int:
    with Session(engine) as s:
        return len(s.execute(select(Event.id).where(Event.seq.is_(None))).all())


def test_the_revoke_service_sends_expired_leases_back_to_pending(engine: Engine, tmp_path: Path) -> None:
    # Given a job's two items claimed by a worker whose leases then ran out
    job = _submit(engine, tmp_path, 2)
    pairs = [(p.item_id, p.token) for p in take_for_dispatch(engine, NOOP)]
    assert all(o.lease for o in store_items.claim_batch(engine, NOOP, pairs, "dead", {}))
    expire_running_leases(engine)
    # When the revoke service runs once
    counts = RevokeExpired(engine, {"noop": NOOP}).run_once()
    # Then both leases are revoked, nothing quarantined, the items are pending again
    assert counts == {"revoked": 2, "quarantined": 0}
    assert _states(engine, job) == ["pending", "pending"]


def test_the_settle_service_settles_the_intent_of_a_stopped_item(engine: Engine, tmp_path: Path) -> None:
    # Given an exif attempt that recorded an intent (staged edit not applied), lost its lease, and
    # whose job was then cancelled
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"BASE")
    inputs = [store_jobs.PhotoInput(str(photo), 4)]
    job = store_jobs.submit(engine, [EXIF], inputs, roots=[str(tmp_path)]).job_id
    [item] = items_of(engine, job)
    _lease, staged, intent = record_staged_edit(engine, EXIF, item.id, photo)
    store_jobs.cancel(engine, job)
    expire_running_leases(engine)
    assert revoke_expired(engine, {"exif": EXIF})[0] == 1
    # When the settle service runs once
    counts = SettleOrphans(engine).run_once()
    # Then the intent is settled (discarded: never applied), its staged file gone, the photo untouched
    assert counts == {"settled": 1}
    with Session(engine) as s:
        assert s.get(Intent, intent).state == "discarded"  # type: ignore[union-attr]
    assert not staged.exists() and photo.read_bytes() == b"BASE"


def test_the_stray_service_removes_old_unowned_staged_files(engine: Engine, tmp_path: Path) -> None:
    # Given a job's root holding a staged file no intent owns, older than the grace period
    _submit(engine, tmp_path, 1, roots=[str(tmp_path)])
    stray = fileops.staged_path(tmp_path / "b.jpg", "i9-t9")
    stray.write_bytes(b"x")
    # When the stray service (no grace) runs once
    counts = RemoveStrayStaged(engine, grace=0.0).run_once()
    # Then the file is removed
    assert counts == {"strays": 1} and not stray.exists()


def test_the_republish_service_republishes_lost_messages(engine: Engine, tmp_path: Path) -> None:
    # Given two items queued a minute ago whose messages no worker holds
    job = _submit(engine, tmp_path, 2)
    assert len(take_for_dispatch(engine, NOOP)) == 2
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.job_id == job).values(queued_at=db_now() - 60))
    publisher = RecordingPublisher()
    # When the republish service runs once
    counts = Republish(engine, publisher, after=2.0).run_once()
    # Then both are published again, and still queued
    assert counts == {"republished": 2}
    assert sorted(p.item_id for p in publisher.published) == [i.id for i in items_of(engine, job)]
    assert _states(engine, job) == ["queued", "queued"]


def test_the_dispatch_service_tops_up_its_lane(engine: Engine, tmp_path: Path) -> None:
    # Given a job of three pending noop items
    job = _submit(engine, tmp_path, 3)
    publisher = RecordingPublisher()
    service = DispatchLane(engine, NOOP, publisher)
    # When the lane's dispatch service runs once
    counts = service.run_once()
    # Then the three are queued and published, and the service is named after its lane
    assert counts == {"dispatched": 3} and len(publisher.published) == 3
    assert _states(engine, job) == ["queued"] * 3
    assert service.name == "dispatch noop"


def test_the_events_service_numbers_the_outbox(engine: Engine, tmp_path: Path) -> None:
    # Given a submission's events, not yet numbered
    _submit(engine, tmp_path, 2)
    waiting = _unnumbered_events(engine)
    assert waiting > 0
    # When the events service runs once
    counts = NumberEvents(engine).run_once()
    # Then every event has its cursor
    assert counts == {"sequenced": waiting} and _unnumbered_events(engine) == 0


def test_the_workers_service_forgets_silent_workers(engine: Engine) -> None:
    # Given a live worker and one silent for two minutes
    for wid in ("h:1:aaaaaa", "h:2:bbbbbb"):
        store_workers.beat(engine, wid, lanes=["noop"], interval=0.5, held=0)
    with Session(engine) as s, s.begin():
        s.execute(update(Worker).where(Worker.id == "h:2:bbbbbb").values(last_beat=db_now() - 120))
    # When the workers service (retention one minute) runs once
    counts = ForgetWorkers(engine, after=60).run_once()
    # Then the silent one is forgotten, the live one kept
    assert counts == {"workers_forgotten": 1}
    with Session(engine) as s:
        assert list(s.scalars(select(Worker.id))) == ["h:1:aaaaaa"]


class Boom(Service):
    name, what = "boom", "exploding on purpose"

    def run_once(self) -> Mapping[str, int]:
        raise RuntimeError("kaboom")


def test_one_failing_service_does_not_stop_the_others(engine: Engine, tmp_path: Path) -> None:
    # Given a pending job, a silent worker, a publisher whose Redis is down, and a service that
    # always raises placed first in the pass
    job = _submit(engine, tmp_path, 2)
    store_workers.beat(engine, "h:2:bbbbbb", lanes=["noop"], interval=0.5, held=0)
    with Session(engine) as s, s.begin():
        s.execute(update(Worker).where(Worker.id == "h:2:bbbbbb").values(last_beat=db_now() - 120))
    services = [Boom(), *default_services(engine, {"noop": NOOP}, BrokenPublisher(), forget_workers_after=60)]
    loop = Maintenance(services)
    # When one pass runs
    report = loop.run_pass()
    # Then the two failures are reported by service name and counted on their services ...
    assert report.errors == ["boom: kaboom", "dispatch noop: redis is down"]
    assert (loop.service("boom").failures, loop.service("dispatch noop").failures) == (1, 1)
    assert loop.service("dispatch noop").last_error == "redis is down"
    # ... and every other service ran and did its duty: the events numbered, the worker forgotten
    assert report.sequenced > 0 and _unnumbered_events(engine) == 0
    assert report.workers_forgotten == 1
    assert all(svc.runs == 1 for svc in loop.services)
    assert [s.failures for s in loop.services if s.name not in ("boom", "dispatch noop")] == [0] * 9
    assert _states(engine, job) == ["queued", "queued"]  # marked; the republish service resends them


@pytest.mark.parametrize("interval", [0.0, 3600.0])
def test_a_service_runs_when_its_interval_has_passed(engine: Engine, interval: float) -> None:
    # Given a loop with the stray sweep at the given interval, beside an every-pass service
    strays = RemoveStrayStaged(engine, interval=interval)
    events = NumberEvents(engine)
    loop = Maintenance([strays, events])
    # When two passes run back to back
    loop.run_pass()
    loop.run_pass()
    # Then the every-pass service ran twice; the stray sweep ran at the first pass, and at the
    # second only when its interval is 0
    assert events.runs == 2
    assert strays.runs == (2 if interval == 0.0 else 1)
    # And the test hook sees the runs without waiting
    assert events.wait_runs(2, timeout=5) and not strays.wait_runs(3, timeout=0.01)


def test_two_loops_keep_their_own_interval_state(engine: Engine) -> None:
    # Given a loop whose stray sweep has run (its interval an hour)
    first = Maintenance([RemoveStrayStaged(engine, interval=3600.0)])
    first.run_pass()
    # When a second loop on the same database runs its first pass
    second = Maintenance([RemoveStrayStaged(engine, interval=3600.0)])
    second.run_pass()
    # Then its stray sweep ran: no state is shared between loops through a module global
    assert second.service("strays").runs == 1


def test_a_running_sweeper_runs_its_services_with_its_settings(env: dict[str, str]) -> None:
    # Given a sweeper (real Redis) with its own republish delay and worker retention, short passes
    settings = Settings.from_env(
        {
            **env,
            "PHOTOJOBS_SWEEP_INTERVAL": "0.2",
            "PHOTOJOBS_REPUBLISH_AFTER": "7",
            "PHOTOJOBS_FORGET_WORKERS_AFTER": "99",
            "PHOTOJOBS_SUBMIT_ABANDONED": "77",
            "PHOTOJOBS_VACUUM_EVERY": "33",
            "PHOTOJOBS_IDEMPOTENCY_KEEP": "55",
        }
    )
    sweeper = Sweeper(settings)
    loop = sweeper.maintenance
    # Then its services are the nine duties in pass order, one dispatch per lane
    lanes = [f"dispatch {name}" for name in sweeper.specs]
    expected = ["revoke", "settle", "strays", "republish", *lanes, "events", "workers", "submissions"]
    expected += ["keys"]
    expected.append("vacuum")
    assert [s.name for s in loop.services] == expected
    # And each carries its setting (the stray sweep its one-minute interval)
    republish, workers, strays = loop.service("republish"), loop.service("workers"), loop.service("strays")
    assert isinstance(republish, Republish) and republish.after == 7.0
    assert isinstance(workers, ForgetWorkers) and workers.after == 99.0
    keys = loop.service("keys")
    assert isinstance(keys, ForgetIdempotencyKeys) and (keys.keep, keys.interval) == (55.0, 600.0)
    assert isinstance(strays, RemoveStrayStaged) and (strays.interval, strays.grace) == (60.0, 300.0)
    submissions = loop.service("submissions")
    assert isinstance(submissions, EndAbandonedSubmissions)
    assert (submissions.after, submissions.interval) == (77.0, 60.0)
    vacuum = loop.service("vacuum")
    assert isinstance(vacuum, VacuumTables) and vacuum.interval == 33.0
    # (and PHOTOJOBS_VACUUM_EVERY=0 leaves the vacuum duty out)
    off = Sweeper(Settings.from_env({**env, "PHOTOJOBS_VACUUM_EVERY": "0"}))
    assert "vacuum" not in [s.name for s in off.maintenance.services]
    off.engine.dispose()
    # When it runs
    sweeper.start()
    try:
        # Then the test hook sees its services run pass after pass, none failing
        assert workers.wait_runs(3, timeout=60), f"{workers.runs} runs"
        assert sweeper.passes >= 3 and all(s.failures == 0 for s in loop.services), loop.services
    finally:
        sweeper.stop()
