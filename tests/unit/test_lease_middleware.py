"""LeaseMiddleware with Dramatiq's StubBroker (unit level; the real-process tests are in tests/process)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from middleware.context import ItemContext, Stopped, current
from middleware.lease import LeaseMiddleware
from photojobs.broker import lane_message
from photos.errors import PhotoError, UnreadableImage
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.lanes import lane_spec
from store.models import Event, Item
from tests.support import events_of, item_row

SPEC = replace(lane_spec("noop", env={}), max_attempts=2, backoff=30.0)


class Harness:
    """A StubBroker with the lease middleware and one noop-lane actor whose body the test sets."""

    def __init__(
        self, engine: Engine, throws: tuple[type[BaseException], ...] = (PhotoError, Stopped)
    ) -> None:
        self.engine = engine
        self.broker = StubBroker(middleware=[])
        self.lease = LeaseMiddleware({"noop": SPEC}, engine_factory=lambda: engine, heartbeat_interval=60)
        self.broker.add_middleware(self.lease)
        self.body: Callable[[ItemContext], Any] = lambda ctx: {"ok": True}
        self.calls = 0

        def lane_noop(item_id: int, token: int) -> None:
            self.calls += 1
            ctx = current()
            ctx.result = self.body(ctx)

        # Declared as actors.lane.lane_actor declares a lane's actor: its ``throws`` fail an item at once.
        dramatiq.actor(
            lane_noop, actor_name=SPEC.actor, queue_name=SPEC.queue, broker=self.broker, throws=throws
        )
        self.broker.emit_after("process_boot")
        self.worker = dramatiq.Worker(self.broker, worker_timeout=50, worker_threads=1)
        self.worker.start()

    def submit(self, n: int = 1) -> list[int]:
        photos = [store_jobs.PhotoInput(f"/photos/p{i}.jpg") for i in range(n)]
        job = store_jobs.submit(self.engine, [SPEC], photos).job_id
        with Session(self.engine) as s:
            return list(s.execute(select(Item.id).where(Item.job_id == job).order_by(Item.id)).scalars())

    def deliver(self, item_id: int, token: int) -> None:
        self.broker.enqueue(lane_message(SPEC, item_id, token))
        self.broker.join(SPEC.queue)
        self.worker.join()

    def item(self, item_id: int) -> Item:
        return item_row(self.engine, item_id)

    def events(self, type: str) -> list[Event]:
        return events_of(self.engine, type)

    def close(self) -> None:
        self.worker.stop()
        self.lease.heartbeat.stop()


@pytest.fixture
def harness(sqlite_engine: Engine) -> Iterator[Harness]:
    h = Harness(sqlite_engine)
    yield h
    h.close()


def test_claim_run_and_finish(harness: Harness) -> None:
    # Given a dispatched item
    [item] = harness.submit()
    [pub] = take_for_dispatch(harness.engine, SPEC)
    # When its message is processed
    harness.deliver(pub.item_id, pub.token)
    # Then the actor ran once under a lease and the item succeeded with its result
    row = harness.item(item)
    assert harness.calls == 1
    assert row.state == "succeeded" and row.result == {"ok": True} and row.fencing_token == 1
    assert row.lease_owner is None and len(harness.events("item_succeeded")) == 1


def test_duplicate_or_stale_message_is_skipped(harness: Harness) -> None:
    # Given an item that already ran
    [item] = harness.submit()
    [pub] = take_for_dispatch(harness.engine, SPEC)
    harness.deliver(pub.item_id, pub.token)
    # When the same message arrives again, and one for an unknown item
    harness.deliver(pub.item_id, pub.token)
    harness.deliver(424242, 0)
    # Then the actor did not run again; both are rejected with their reason
    assert harness.calls == 1
    reasons = [e.detail["reason"] for e in harness.events("message_rejected")]  # type: ignore[index]
    assert any("stale token" in r for r in reasons) and any("unknown item 424242" in r for r in reasons)
    assert harness.item(item).state == "succeeded"


@pytest.mark.parametrize("stop", ["pause", "cancel"])
def test_a_message_for_an_item_its_job_stopped_is_skipped_unrejected(engine: Engine, stop: str) -> None:
    # Given a dispatched item whose job is then paused (or cancelled), on either store
    h = Harness(engine)
    try:
        [item] = h.submit()
        [pub] = take_for_dispatch(h.engine, SPEC)
        getattr(store_jobs, stop)(h.engine, h.item(item).job_id)
        # When its message arrives
        h.deliver(pub.item_id, pub.token)
        # Then the actor did not run, and it is a normal skip: no message_rejected event
        assert h.calls == 0
        assert h.events("message_rejected") == []
        assert h.item(item).state == {"pause": "paused", "cancel": "cancelled"}[stop]
    finally:
        h.close()


def test_malformed_arguments_are_rejected_before_any_claim(harness: Harness) -> None:
    # Given a pending item
    [item] = harness.submit()
    # When a message with the wrong argument shape arrives
    bad = lane_message(SPEC, item, 0)._replace(args=("x", 0))  # type: ignore[attr-defined]
    harness.broker.enqueue(bad)
    harness.broker.join(SPEC.queue)
    harness.worker.join()
    # Then it is rejected with a clear reason and the item is untouched
    assert harness.calls == 0
    [event] = harness.events("message_rejected")
    assert "item id must be a positive integer" in event.detail["reason"]  # type: ignore[index]
    assert harness.item(item).state == "pending" and harness.item(item).fencing_token == 0


def test_commit_after_lost_lease_is_fenced(harness: Harness) -> None:
    # Given an item whose lease is revoked while the actor runs (token bumped by a "sweeper")
    [item] = harness.submit()
    [pub] = take_for_dispatch(harness.engine, SPEC)

    def revoked_midway(ctx: ItemContext) -> dict[str, str]:
        with Session(harness.engine) as s, s.begin():
            s.execute(
                update(Item)
                .where(Item.id == ctx.item_id)
                .values(state="pending", fencing_token=Item.fencing_token + 1)
            )
        return {"zombie": "result"}

    harness.body = revoked_midway
    # When the actor finishes and the middleware commits
    harness.deliver(pub.item_id, pub.token)
    # Then the commit is refused: no success, a stale_commit_rejected event, nothing written
    row = harness.item(item)
    assert row.state == "pending" and row.result is None
    assert len(harness.events("stale_commit_rejected")) == 1 and harness.events("item_succeeded") == []


def test_renewal_reports_cancel_and_the_item_stops(harness: Harness) -> None:
    # Given an actor that waits at safe points until told to stop
    [item] = harness.submit()
    [pub] = take_for_dispatch(harness.engine, SPEC)
    started = threading.Event()

    def cooperative(ctx: ItemContext) -> None:
        started.set()
        while True:
            ctx.check()
            threading.Event().wait(0.01)

    harness.body = cooperative
    t = threading.Thread(target=harness.deliver, args=(pub.item_id, pub.token))
    t.start()
    assert started.wait(10)
    # When the job is cancelled and the heartbeat renews the lease
    store_jobs.cancel(harness.engine, harness.item(item).job_id)
    harness.lease.heartbeat.beat()
    t.join(10)
    # Then the lease was renewed, the stop request passed on, and the item ended cancelled
    assert not t.is_alive()
    assert harness.item(item).state == "cancelled"
    assert [e.type for e in harness.events("item_cancelled")] == ["item_cancelled"]


def test_errors_retry_with_backoff_then_fail(harness: Harness) -> None:
    # Given an actor that always raises, in a lane of 2 attempts
    [item] = harness.submit()
    harness.body = lambda ctx: 1 / 0
    # When the first attempt fails
    [pub] = take_for_dispatch(harness.engine, SPEC)
    harness.deliver(pub.item_id, pub.token)
    first = harness.item(item)
    # Then it waits as pending with a backoff, counted in the store
    assert first.state == "pending" and first.attempt == 1 and "ZeroDivisionError" in (first.error or "")
    assert first.not_before > first.updated_at
    # When the second (last) attempt fails too
    harness.deliver(item, first.fencing_token)
    # Then it is failed for good
    last = harness.item(item)
    assert last.state == "failed" and last.attempt == 2


def test_bad_photo_fails_at_once_without_retry(harness: Harness) -> None:
    # Given an actor that meets a corrupt photo
    [item] = harness.submit()

    def corrupt(ctx: ItemContext) -> None:
        raise UnreadableImage("/photos/p0.jpg", "truncated JPEG")

    harness.body = corrupt
    [pub] = take_for_dispatch(harness.engine, SPEC)
    # When it runs
    harness.deliver(pub.item_id, pub.token)
    # Then the item fails once, with the file and the reason, and is not retried
    row = harness.item(item)
    assert row.state == "failed" and row.attempt == 1 and row.error == "/photos/p0.jpg: truncated JPEG"


def test_the_actors_throws_decide_which_errors_fail_at_once(sqlite_engine: Engine) -> None:
    # Given a lane actor that declares ZeroDivisionError (not PhotoError) in its Dramatiq ``throws``
    h = Harness(sqlite_engine, throws=(ZeroDivisionError, Stopped))
    try:
        divides, photo = h.submit(2)

        def body(ctx: ItemContext) -> None:
            if ctx.item_id == divides:
                raise ZeroDivisionError("division by zero")
            raise UnreadableImage("/photos/p1.jpg", "truncated JPEG")

        h.body = body
        # When both items run once
        for pub in take_for_dispatch(h.engine, SPEC):
            h.deliver(pub.item_id, pub.token)
        # Then the declared error failed its item for good, without retry and with its bare message,
        # while the undeclared PhotoError is retried like any other error
        first, second = h.item(divides), h.item(photo)
        assert first.state == "failed" and first.attempt == 1 and first.error == "division by zero"
        assert second.state == "pending" and second.attempt == 1
        assert second.error == "UnreadableImage: /photos/p1.jpg: truncated JPEG"
    finally:
        h.close()


class ScriptedPublisher:
    """A publisher whose lane queue lengths the test scripts; it counts what it is asked."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.asked = 0
        self.published: list[int] = []

    def queue_length(self, lane: str) -> int:
        self.asked += 1
        return self.lengths.pop(0)

    def publish(self, items: list[Any]) -> None:
        self.published.append(len(items))


def test_top_up_asks_redis_once_per_batch_not_once_per_item(sqlite_engine: Engine) -> None:
    # Given a lane bound of 16 over 2 fleet processes (top up below 8), whose queue holds 16
    spec = replace(SPEC, bound=16, fleet_processes=2)
    publisher = ScriptedPublisher([16, 7])
    lease = LeaseMiddleware(
        {"noop": spec},
        engine_factory=lambda: sqlite_engine,
        heartbeat_interval=60,
        publisher_factory=lambda broker: publisher,
    )
    ctx = SimpleNamespace(spec=spec, item_id=1, lease=SimpleNamespace(job_lanes=("noop",)))
    # When five items finish in this process
    for _ in range(5):
        lease.top_up(StubBroker(middleware=[]), ctx)  # type: ignore[arg-type]
    # Then Redis was asked once: 16 - 8 = 8 more items must go before the queue is at half, this
    # process's share of them (4) is not asked about
    assert publisher.asked == 1 and publisher.published == []
    # And the next finished item asks again, finds room (7) and dispatches
    lease.top_up(StubBroker(middleware=[]), ctx)  # type: ignore[arg-type]
    assert publisher.asked == 2 and publisher.published == [0]
