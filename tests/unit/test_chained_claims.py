"""Chained claims (``middleware.finishing``, ``middleware.preclaims``): a successful finish also
claims the next message waiting in the worker's work queue, in the same write transaction. With
Dramatiq's StubBroker, one worker thread and a real SQLite store (every process test and chaos run
uses them too: they are on by default)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import Engine, event

from middleware.context import ItemContext, current
from middleware.lease import LeaseMiddleware
from photojobs.broker import lane_message
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.lanes import lane_spec
from store.models import Event, Item
from tests.support import events_of, item_row

SPEC = replace(lane_spec("noop", env={}), max_attempts=2, bound=16)


class Harness:
    """A StubBroker with ``first`` middleware (optional), the lease middleware and a noop actor."""

    def __init__(self, engine: Engine, first: dramatiq.Middleware | None = None) -> None:
        self.engine = engine
        self.broker = StubBroker(middleware=[])
        if first is not None:
            self.broker.add_middleware(first)
        self.lease = LeaseMiddleware({"noop": SPEC}, engine_factory=lambda: engine, heartbeat_interval=60)
        self.broker.add_middleware(self.lease)
        self.body: Callable[[ItemContext], Any] = lambda ctx: {"ok": True}
        self.ran: list[int] = []

        def lane_noop(item_id: int, token: int) -> None:
            self.ran.append(item_id)
            ctx = current()
            ctx.result = self.body(ctx)

        dramatiq.actor(lane_noop, actor_name=SPEC.actor, queue_name=SPEC.queue, broker=self.broker)
        self.broker.emit_after("process_boot")
        self.worker = dramatiq.Worker(self.broker, worker_timeout=50, worker_threads=1)

    def submit_and_dispatch(self, n: int) -> list[tuple[int, int]]:
        photos = [store_jobs.PhotoInput(f"/photos/p{i}.jpg") for i in range(n)]
        store_jobs.submit(self.engine, [SPEC], photos)
        return [(p.item_id, p.token) for p in take_for_dispatch(self.engine, SPEC)]

    def wait_for_queued_messages(self, ctx: ItemContext) -> None:
        """The actor's body: wait (10 s at most) until the next message is in the work queue."""
        deadline = time.monotonic() + 10
        while self.worker.work_queue.qsize() == 0 and time.monotonic() < deadline:
            time.sleep(0.005)

    def item(self, item_id: int) -> Item:
        return item_row(self.engine, item_id)

    def events(self, type: str) -> list[Event]:
        return events_of(self.engine, type)

    def run_to_end(self) -> int:
        """Start the worker, wait until every message was processed, stop it; returns the write
        transactions committed meanwhile, less the worker's registry entry at boot."""
        commits = [0]

        def on_commit(conn: Any) -> None:
            commits[0] += 1

        event.listen(self.engine, "commit", on_commit)
        self.worker.start()
        try:
            self.broker.join(SPEC.queue)
            self.worker.join()
            return commits[0] - 1
        finally:
            event.remove(self.engine, "commit", on_commit)
            self.close()

    def close(self) -> None:
        self.worker.stop(timeout=5000)
        self.lease.heartbeat.stop()


def test_each_finish_claims_the_next_waiting_message_in_its_own_transaction(sqlite_engine: Engine) -> None:
    # Given five dispatched items whose messages all wait for one worker thread, and an actor that
    # returns only once the next message is in the work queue
    h = Harness(sqlite_engine)
    published = h.submit_and_dispatch(5)
    h.body = lambda ctx: (h.wait_for_queued_messages(ctx) if len(h.ran) < 5 else None, {"ok": True})[1]
    for item_id, token in published:
        h.broker.enqueue(lane_message(SPEC, item_id, token))
    # When the worker runs them
    during = h.run_to_end()
    # Then each ran once and succeeded; the first was claimed on its own, the other four by the
    # finish of the one before: 5 finishes + 1 claim = 6 write transactions instead of 10
    ids = [i for i, _ in published]
    assert sorted(h.ran) == ids
    assert [h.item(i).state for i in ids] == ["succeeded"] * 5
    assert h.lease.chained == 4
    assert during == 6
    claimed = [e.item_id for e in h.events("item_claimed")]
    assert sorted(claimed) == ids  # one claim each, with its event
    assert [h.item(i).attempt for i in ids] == [1] * 5
    assert not h.events("message_rejected")


def test_a_stale_message_is_not_claimed_by_a_finish(sqlite_engine: Engine) -> None:
    # Given a dispatched item and, behind it, a message for a second item with a token it is not at
    h = Harness(sqlite_engine)
    (a, ta), (b, tb) = h.submit_and_dispatch(2)
    h.body = lambda ctx: (h.wait_for_queued_messages(ctx) if ctx.item_id == a else None, {"ok": True})[1]
    h.broker.enqueue(lane_message(SPEC, a, ta))
    h.broker.enqueue(lane_message(SPEC, b, tb + 7))
    # When the worker runs the first
    h.run_to_end()
    # Then the finish claimed nothing (the compare-and-set on the token), the stale message was
    # rejected by its own claim, and the second item is still queued, untouched
    assert h.ran == [a] and h.lease.chained == 0
    assert h.item(b).state == "queued" and h.item(b).attempt == 0 and h.item(b).fencing_token == tb
    reasons = [e.detail["reason"] for e in h.events("message_rejected")]  # type: ignore[index]
    assert len(reasons) == 1 and "stale token" in reasons[0]


class _HoldSecond(dramatiq.Middleware):
    """Runs before the lease middleware: holds the second message of the run until ``go`` is set."""

    def __init__(self) -> None:
        self.seen = 0
        self.reached = threading.Event()
        self.go = threading.Event()

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        self.seen += 1
        if self.seen == 2:
            self.reached.set()
            self.go.wait(30)


def test_a_claimed_item_that_never_started_goes_back_at_shutdown_without_using_an_attempt(
    sqlite_engine: Engine,
) -> None:
    # Given a finish that claimed the next message, whose processing has not reached the lease
    # middleware yet (held by a middleware before it)
    hold = _HoldSecond()
    h = Harness(sqlite_engine, first=hold)
    (a, ta), (b, tb) = h.submit_and_dispatch(2)
    h.body = lambda ctx: (h.wait_for_queued_messages(ctx), {"ok": True})[1]
    h.broker.enqueue(lane_message(SPEC, a, ta))
    h.broker.enqueue(lane_message(SPEC, b, tb))
    h.worker.start()
    try:
        assert hold.reached.wait(30), "the second message never reached the worker thread"
        assert h.lease.chained == 1
        held = h.item(b)
        assert held.state == "running" and held.lease_owner == h.lease.worker and held.attempt == 1
        # When the worker shuts down before the item starts
        h.lease.before_worker_shutdown(h.broker, h.worker)
    finally:
        hold.go.set()
        h.close()
    # Then the item is ready again with its attempt given back, and never ran here
    row = h.item(b)
    assert row.state == "pending" and row.attempt == 0 and row.lease_owner is None
    assert h.ran == [a]
    [released] = h.events("item_released")
    assert released.item_id == b and "before the item started" in released.detail["reason"]  # type: ignore[index]


def test_a_chained_claim_that_raises_leaves_the_finish_whole(
    sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given two dispatched items, and a claim that raises whenever it runs inside a savepoint
    # (the chained claim; the message's own claim runs in a transaction of its own)
    from store import claims as store_claims

    real = store_claims._claim_in

    def broken(conn: Any, *args: Any) -> Any:
        if conn.in_nested_transaction():
            raise RuntimeError("chained claim broken for the test")
        return real(conn, *args)

    monkeypatch.setattr(store_claims, "_claim_in", broken)
    caplog.set_level(logging.WARNING, logger="photojobs.store")
    h = Harness(sqlite_engine)
    (a, ta), (b, tb) = h.submit_and_dispatch(2)
    h.body = lambda ctx: (h.wait_for_queued_messages(ctx) if ctx.item_id == a else None, {"ok": True})[1]
    h.broker.enqueue(lane_message(SPEC, a, ta))
    h.broker.enqueue(lane_message(SPEC, b, tb))
    # When the worker runs them
    h.run_to_end()
    # Then the first item's finish committed, the second was claimed by its own message and ran,
    # and the failed chained claim was logged
    assert h.ran == [a, b] and h.lease.chained == 0
    assert h.item(a).state == "succeeded" and h.item(b).state == "succeeded"
    assert [h.item(i).attempt for i in (a, b)] == [1, 1]
    assert any("chained claim of item" in r.getMessage() for r in caplog.records)


def test_on_postgresql_each_message_claims_on_its_own(engine: Engine) -> None:
    # Given five queued messages and an actor that waits for the next one, on either store
    h = Harness(engine)
    published = h.submit_and_dispatch(5)
    h.body = lambda ctx: (h.wait_for_queued_messages(ctx) if len(h.ran) < 5 else None, {"ok": True})[1]
    for item_id, token in published:
        h.broker.enqueue(lane_message(SPEC, item_id, token))
    # When the worker runs them
    h.run_to_end()
    # Then every item succeeded once; finishes chained claims on SQLite only (on PostgreSQL a claim
    # inside another item's finish would take row locks out of the global lock order)
    ids = [i for i, _ in published]
    assert [h.item(i).state for i in ids] == ["succeeded"] * 5
    assert h.lease.chained == (4 if engine.dialect.name == "sqlite" else 0)
