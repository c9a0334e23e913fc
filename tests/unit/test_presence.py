"""The lease middleware's worker-registry entry with Dramatiq's StubBroker (the real-process test is
tests/process/test_worker_registry.py)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from middleware.heartbeat import Heartbeat
from middleware.lease import LeaseMiddleware
from store.engine import make_engine
from store.lanes import all_lanes
from store.models import Worker
from store.schema import upgrade
from tests.support import wait_for


def _rows(engine: Engine) -> list[Worker]:
    with Session(engine) as s:
        return list(s.execute(select(Worker)).scalars())


def _boot(engine: Engine, queues: set[str]) -> tuple[LeaseMiddleware, dramatiq.Worker]:
    specs = all_lanes({})
    broker = StubBroker(middleware=[])
    lease = LeaseMiddleware(specs, engine_factory=lambda: engine, heartbeat_interval=0.1)
    broker.add_middleware(lease)
    for spec in specs.values():
        broker.declare_queue(spec.queue)
    broker.emit_after("process_boot")
    worker = dramatiq.Worker(broker, queues=queues, worker_timeout=50, worker_threads=1)
    worker.start()
    return lease, worker


def test_a_worker_registers_at_boot_beats_while_idle_and_is_marked_stopped(tmp_path: Path) -> None:
    # Given a migrated store and a worker booting on the exif and rename queues, beating every 0.1 s
    engine = make_engine(f"sqlite:///{tmp_path / 'unit.db'}")
    upgrade(engine)
    lease, worker = _boot(engine, {"photojobs.exif", "photojobs.rename"})
    try:
        # Then it is registered at once with its identity, lanes and interval, holding nothing
        [row] = _rows(engine)
        assert row.id == lease.worker and row.lanes == ["exif", "rename"] and row.interval == 0.1
        assert row.items_held == 0 and row.stopped_at is None
        # And idle, it keeps beating
        first = row.last_beat
        wait_for(lambda: _rows(engine)[0].last_beat > first, 30, what="an idle beat")
    finally:
        # When it shuts down cleanly
        worker.stop()
        lease.heartbeat.stop()
    # Then it is marked stopped, and no later beat clears the mark
    [row] = _rows(engine)
    assert row.stopped_at is not None and row.stopped_at >= row.started_at
    engine.dispose()


def test_a_registry_failure_is_logged_once_and_the_worker_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a store without the workers table (not migrated)
    engine = make_engine(f"sqlite:///{tmp_path / 'bare.db'}")
    caplog.set_level(logging.WARNING, logger="photojobs.heartbeat")
    # When a worker boots and beats a few times
    lease, worker = _boot(engine, {"photojobs.noop"})
    try:
        beats: list[int] = []
        hb = lease.heartbeat
        original = hb.on_beat
        assert original is not None
        hb.on_beat = lambda held: (beats.append(held), original(held))  # type: ignore[func-returns-value]
        wait_for(lambda: len(beats) >= 3, 30, what="three beats")
    finally:
        worker.stop()
        lease.heartbeat.stop()
    # Then the heartbeat kept running and the failure was logged once, not at every beat
    warnings = [r for r in caplog.records if "worker registry" in r.getMessage()]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    engine.dispose()


def test_the_heartbeat_reports_idle_beats_with_the_items_held(tmp_path: Path) -> None:
    # Given a heartbeat with an on_beat hook and no items
    engine = make_engine(f"sqlite:///{tmp_path / 'hb.db'}")
    seen: list[int] = []
    hb = Heartbeat(engine, 0.05, on_beat=seen.append)
    # When it runs a few intervals
    hb.start()
    try:
        wait_for(lambda: len(seen) >= 3, 30, what="idle beats reported")
    finally:
        hb.stop()
    # Then every beat was reported, with no items held
    assert set(seen) == {0}
    engine.dispose()


class _FirstMessage(dramatiq.Middleware):
    """Records the registry rows when the worker's first message starts; holds the worker's
    ``after_worker_boot`` hooks (this middleware runs first) until then."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.started = threading.Event()
        self.registry: list[str] | None = None

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        self.registry = [r.id for r in _rows(self.engine)]
        self.started.set()

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.started.wait(30)


def test_a_worker_is_registered_before_its_first_message_runs(tmp_path: Path) -> None:
    # Given a migrated store, a message waiting on the worker's queue, and a middleware that lets
    # the first message run before any after_worker_boot hook (Dramatiq starts the worker threads
    # between before_worker_boot and after_worker_boot)
    engine = make_engine(f"sqlite:///{tmp_path / 'first.db'}")
    upgrade(engine)
    specs = all_lanes({})
    broker = StubBroker(middleware=[])
    first = _FirstMessage(engine)
    broker.add_middleware(first)
    lease = LeaseMiddleware(specs, engine_factory=lambda: engine, heartbeat_interval=0.1)
    broker.add_middleware(lease)
    broker.declare_queue("photojobs.noop")
    probe = dramatiq.actor(lambda: None, broker=broker, queue_name="photojobs.noop", actor_name="probe")
    probe.send()
    broker.emit_after("process_boot")
    # When the worker boots
    worker = dramatiq.Worker(broker, queues={"photojobs.noop"}, worker_timeout=50, worker_threads=1)
    worker.start()
    try:
        assert first.started.wait(30), "the message never ran"
        # Then the registry already listed the worker when its first message started
        assert first.registry == [lease.worker]
    finally:
        worker.stop()
        lease.heartbeat.stop()
    engine.dispose()
