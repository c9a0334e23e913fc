"""Batch messages (``middleware.claiming``, ``middleware.finishing`` + ``middleware.batch``): one
lane message names several items, claimed in one transaction, run in turn by the lane's own actor
(``actors.lane``), finished in one transaction — each item keeping its own lease, fence, outcome,
stop requests and time limit. With Dramatiq's StubBroker, one worker thread and a real SQLite store
(the process tests and chaos runs use batches too: they are on for the noop and analysis lanes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import TimeLimit
from dramatiq.middleware.time_limit import TimeLimitExceeded
from sqlalchemy import Engine, event, update
from sqlalchemy.orm import Session

from actors.lane import lane_actor
from middleware.context import STOP_SHUTDOWN, ItemContext
from middleware.lease import LeaseMiddleware
from photojobs.broker import batch_message
from photos.errors import UnreadableImage
from store import jobs as store_jobs
from store.dispatch import Publish
from store.lanes import lane_spec
from store.models import Event, Item
from tests.support import events_of, item_row, wait_for

SPEC = replace(lane_spec("noop", env={}), max_attempts=3, backoff=30.0, time_limit=1.0)


class BatchHarness:
    """A StubBroker with Dramatiq's TimeLimit, the lease middleware and the real noop lane actor
    (``actors.lane.lane_actor``), whose per-item body the test sets."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine = engine
        self.broker = StubBroker(middleware=[TimeLimit(interval=20)])
        self.lease = LeaseMiddleware({"noop": SPEC}, engine_factory=lambda: engine, heartbeat_interval=60)
        self.broker.add_middleware(self.lease)
        self.body: Callable[[ItemContext], Any] = lambda ctx: {"item": ctx.item_id}
        self.ran: list[int] = []
        # The actor is declared with the lane's time limit (1 s): Dramatiq's clock for the message.
        monkeypatch.setenv("PHOTOJOBS_LANE_NOOP_TIME_LIMIT", "1")
        dramatiq.set_broker(self.broker)

        def noop(ctx: ItemContext) -> Any:
            self.ran.append(ctx.item_id)
            return self.body(ctx)

        lane_actor("noop")(noop)
        self.broker.emit_after("process_boot")
        self.worker = dramatiq.Worker(self.broker, worker_timeout=50, worker_threads=1)
        self.worker.start()
        self.commits = 0
        event.listen(engine, "commit", self._count)

    def _count(self, conn: Any) -> None:
        self.commits += 1

    def submit(self, n: int) -> list[int]:
        photos = [store_jobs.PhotoInput(f"/photos/p{i}.jpg") for i in range(n)]
        job = store_jobs.submit(self.engine, [SPEC], photos).job_id
        with Session(self.engine) as s:
            ids = s.execute(Item.__table__.select().where(Item.job_id == job).order_by(Item.id)).all()
        return [r.id for r in ids]

    def deliver(self, pairs: list[tuple[int, int]]) -> int:
        """One batch message naming ``pairs``, processed to the end; the write transactions it took."""
        before = self.commits
        self.broker.enqueue(batch_message(SPEC, [Publish(i, t, "noop") for i, t in pairs]))
        self.broker.join(SPEC.queue)
        self.worker.join()
        return self.commits - before

    def item(self, item_id: int) -> Item:
        return item_row(self.engine, item_id)

    def events(self, type: str, item_id: int | None = None) -> list[Event]:
        return events_of(self.engine, type, item_id)

    def close(self) -> None:
        event.remove(self.engine, "commit", self._count)
        self.worker.stop()
        self.lease.heartbeat.stop()


@pytest.fixture
def harness(sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchHarness]:
    h = BatchHarness(sqlite_engine, monkeypatch)
    yield h
    h.close()


def test_a_batch_message_claims_its_items_in_one_transaction_and_finishes_them_in_another(
    harness: BatchHarness,
) -> None:
    # Given four pending items
    items = harness.submit(4)
    # When one message names all four
    commits = harness.deliver([(i, 0) for i in items])
    # Then each ran once, in order, under its own lease, and succeeded with its own result
    assert harness.ran == items
    for i in items:
        row = harness.item(i)
        assert row.state == "succeeded" and row.result == {"item": i} and row.attempt == 1
        assert row.fencing_token == 1 and row.lease_owner is None
        assert len(harness.events("item_claimed", i)) == 1 and len(harness.events("item_succeeded", i)) == 1
    # And the whole batch took two write transactions: its claim and its finish
    assert commits == 2


def test_an_items_error_fails_that_item_alone(harness: BatchHarness) -> None:
    # Given four items, of which the second raises an error and the third is a bad photo
    items = harness.submit(4)

    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id == items[1]:
            raise RuntimeError("disk hiccup")
        if ctx.item_id == items[2]:
            raise UnreadableImage("/photos/p2.jpg", "not an image")
        return {"item": ctx.item_id}

    harness.body = body
    # When their batch message is processed
    harness.deliver([(i, 0) for i in items])
    # Then the error is retried later, the bad photo fails at once, and the others succeeded
    assert harness.ran == items
    retried, bad = harness.item(items[1]), harness.item(items[2])
    assert retried.state == "pending" and "RuntimeError: disk hiccup" in (retried.error or "")
    assert bad.state == "failed" and "not an image" in (bad.error or "")
    assert [harness.item(i).state for i in (items[0], items[3])] == ["succeeded", "succeeded"]


def test_an_item_whose_lease_was_lost_is_refused_and_its_batch_mates_commit(harness: BatchHarness) -> None:
    # Given three items, the second of which is revoked (token bumped, as the sweeper does) while
    # the first runs
    items = harness.submit(3)

    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id == items[0]:
            with Session(harness.engine) as s, s.begin():
                s.execute(
                    update(Item)
                    .where(Item.id == items[1])
                    .values(state="pending", fencing_token=Item.fencing_token + 1, lease_owner=None)
                )
        return {"item": ctx.item_id}

    harness.body = body
    # When the batch runs and finishes
    harness.deliver([(i, 0) for i in items])
    # Then the revoked item's success is refused by its fence and recorded as such; nothing of it
    # was written, while the other two committed
    revoked = harness.item(items[1])
    assert revoked.state == "pending" and revoked.result is None and revoked.fencing_token == 2
    [stale] = harness.events("stale_commit_rejected", items[1])
    assert stale.detail["what"] == "succeed"  # type: ignore[index]
    assert harness.events("item_succeeded", items[1]) == []
    assert [harness.item(i).state for i in (items[0], items[2])] == ["succeeded", "succeeded"]


def test_a_stale_pair_in_a_batch_message_is_rejected_and_the_others_run(harness: BatchHarness) -> None:
    # Given three pending items
    items = harness.submit(3)
    # When a message names the second with a token it never had
    harness.deliver([(items[0], 0), (items[1], 5), (items[2], 0)])
    # Then that item is rejected with its reason and untouched; the others ran and succeeded
    assert harness.ran == [items[0], items[2]]
    [rejected] = harness.events("message_rejected")
    assert "stale token 5" in rejected.detail["reason"]  # type: ignore[index]
    assert harness.item(items[1]).state == "pending" and harness.item(items[1]).attempt == 0
    assert {harness.item(i).state for i in (items[0], items[2])} == {"succeeded"}


def test_items_whose_job_is_cancelled_before_their_turn_never_start_and_keep_their_attempts(
    harness: BatchHarness,
) -> None:
    # Given three items whose job is cancelled while the first runs (the heartbeat passes it on)
    items = harness.submit(3)
    job_id = harness.item(items[0]).job_id

    def body(ctx: ItemContext) -> dict[str, int]:
        store_jobs.cancel(harness.engine, job_id)
        harness.lease.heartbeat.beat()
        return {"item": ctx.item_id}

    harness.body = body
    # When the batch runs
    harness.deliver([(i, 0) for i in items])
    # Then only the first ran; the two others are cancelled, their leases ended, and the attempt
    # their claim charged is handed back (as a pause does): they never ran
    assert harness.ran == [items[0]]
    for i in items[1:]:
        row = harness.item(i)
        assert row.state == "cancelled" and row.lease_owner is None
        assert row.attempt == 0
        assert len(harness.events("item_cancelled", i)) == 1


def test_a_worker_shutting_down_releases_the_items_not_yet_started(harness: BatchHarness) -> None:
    # Given three items, and a worker that starts shutting down while the first runs
    items = harness.submit(3)

    def body(ctx: ItemContext) -> dict[str, int]:
        harness.lease.heartbeat.stop_all(STOP_SHUTDOWN, "worker shutting down")
        return {"item": ctx.item_id}

    harness.body = body
    # When the batch ends
    harness.deliver([(i, 0) for i in items])
    # Then the first (finished) succeeded; the others went back to pending without an attempt
    assert harness.ran == [items[0]] and harness.item(items[0]).state == "succeeded"
    for i in items[1:]:
        row = harness.item(i)
        assert row.state == "pending" and row.attempt == 0
        assert len(harness.events("item_released", i)) == 1


def test_each_item_of_a_batch_gets_the_lanes_whole_time_limit(harness: BatchHarness) -> None:
    # Given three items of a lane whose time limit is 1 s, each taking 0.6 s (1.8 s for the message)
    items = harness.submit(3)

    def body(ctx: ItemContext) -> dict[str, int]:
        time.sleep(0.6)
        return {"item": ctx.item_id}

    harness.body = body
    # When their batch runs
    harness.deliver([(i, 0) for i in items])
    # Then none was interrupted: the clock restarts at each item
    assert [harness.item(i).state for i in items] == ["succeeded"] * 3


def test_an_item_over_its_time_limit_is_interrupted_and_fails_alone(harness: BatchHarness) -> None:
    # Given three items of a lane whose time limit is 1 s, the second of which never ends by itself
    items = harness.submit(3)

    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id == items[1]:
            for _ in range(100):  # 5 s, interruptible between sleeps
                time.sleep(0.05)
        return {"item": ctx.item_id}

    harness.body = body
    # When their batch runs
    harness.deliver([(i, 0) for i in items])
    # Then the second was interrupted by Dramatiq's TimeLimit and is retried; the others succeeded
    slow = harness.item(items[1])
    assert slow.state == "pending" and "TimeLimitExceeded" in (slow.error or "")
    assert [harness.item(i).state for i in (items[0], items[2])] == ["succeeded", "succeeded"]


def test_an_interrupt_at_an_items_clock_restart_runs_neither_it_nor_the_rest_and_charges_them_nothing(
    harness: BatchHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three items, and a time-limit interrupt that lands as the second item's clock restarts
    # (TimeLimit arms the message, then the lane restarts the clock before each item: 3rd arming)
    items = harness.submit(3)
    manager = time_limit(harness).manager
    arm = manager.add_timeout
    armed: list[int] = []

    def add_timeout(thread_id: int, ttl: float) -> None:
        armed.append(thread_id)
        if len(armed) == 3:
            raise TimeLimitExceeded()
        arm(thread_id, ttl)

    monkeypatch.setattr(manager, "add_timeout", add_timeout)
    # When the batch runs
    harness.deliver([(i, 0) for i in items])
    # Then the first succeeded; the second is not marked succeeded (it never ran: no result), and
    # neither it nor the third lost an attempt: both are released to pending, attempt 0
    assert harness.ran == [items[0]]
    assert harness.item(items[0]).state == "succeeded"
    for i in items[1:]:
        row = harness.item(i)
        assert (row.state, row.attempt, row.result) == ("pending", 0, None)
        assert harness.events("item_succeeded", i) == [] and len(harness.events("item_released", i)) == 1


def time_limit(harness: BatchHarness) -> TimeLimit:
    return next(m for m in harness.broker.middleware if isinstance(m, TimeLimit))


def on_finish(harness: BatchHarness, hook: Callable[[], None]) -> Callable[[], None]:
    """Run ``hook`` in the worker thread at the first statement that ends an item as succeeded
    (inside the finishing transaction); returns the remover."""
    main = threading.get_ident()

    def before(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if threading.get_ident() != main and "state = 'succeeded'" in statement:
            hook()

    event.listen(harness.engine, "before_cursor_execute", before)
    return lambda: event.remove(harness.engine, "before_cursor_execute", before)


@pytest.mark.parametrize("n", [1, 3], ids=["single", "batch"])
def test_a_time_limit_running_out_during_the_finish_does_not_interrupt_it(
    harness: BatchHarness, n: int
) -> None:
    # Given items of a lane with a 1 s time limit, and a finish that is held (as another
    # connection's write lock would hold it) until the message's time limit is no longer armed:
    # still armed, Dramatiq's TimeLimit fires within 1 s and raises inside the finishing transaction
    items = harness.submit(n)
    manager = time_limit(harness).manager
    held: list[bool] = []

    def hold() -> None:
        if not held:
            held.append(True)
            me = threading.get_ident()
            wait_for(lambda: manager.deadlines.get(me) is None, 10, 0.01, "the time limit disarmed or fired")

    remove = on_finish(harness, hold)
    try:
        # When the items run and are finished
        harness.deliver([(i, 0) for i in items])
    finally:
        remove()
    # Then every item committed its success exactly once: the time limit was disarmed before the finish
    assert held
    for i in items:
        row = harness.item(i)
        assert (row.state, row.result, row.attempt) == ("succeeded", {"item": i}, 1)
        assert len(harness.events("item_succeeded", i)) == 1


@pytest.mark.parametrize("n", [1, 3], ids=["single", "batch"])
def test_an_interrupt_landing_inside_the_finish_is_finished_then_re_raised(
    harness: BatchHarness, n: int
) -> None:
    # Given items whose finishing transaction is hit by a TimeLimitExceeded (one the time limit's
    # thread raised just before the finish disarmed it)
    items = harness.submit(n)
    raised: list[bool] = []
    ended = Recorder()
    harness.broker.add_middleware(ended, before=LeaseMiddleware)  # its after-hook runs after the lease's

    def interrupt() -> None:
        if not raised:
            raised.append(True)
            raise TimeLimitExceeded()

    remove = on_finish(harness, interrupt)
    try:
        # When the items run and are finished
        harness.deliver([(i, 0) for i in items])
    finally:
        remove()
    # Then the finish ran again to its end: every item succeeded once, none is left running;
    # and the interrupt was raised again to Dramatiq, which ended the message with it
    assert raised
    for i in items:
        row = harness.item(i)
        assert (row.state, row.result, row.lease_owner) == ("succeeded", {"item": i}, None)
        assert len(harness.events("item_succeeded", i)) == 1
    assert [type(e) for e in ended.exceptions] == [TimeLimitExceeded]


class Recorder(dramatiq.Middleware):
    """The exceptions Dramatiq ends messages with (its ``after_process_message`` hook)."""

    def __init__(self) -> None:
        self.exceptions: list[BaseException] = []

    def after_process_message(
        self, broker: Any, message: Any, *, result: Any = None, exception: Any = None
    ) -> None:
        if exception is not None:
            self.exceptions.append(exception)


def _work_queue_holds(harness: BatchHarness, n: int) -> bool:
    return harness.worker.work_queue.qsize() >= n


def _send_interactive(harness: BatchHarness, item: int) -> None:
    """``item``'s interactive message, sent from inside a running item: back once the worker has it."""
    harness.broker.enqueue(batch_message(SPEC, [Publish(item, 0, "noop", interactive=True)]))
    wait_for(lambda: _work_queue_holds(harness, 1), 10, what="the interactive message queued")


def _deliver_with_interactive(harness: BatchHarness, batch: list[int]) -> None:
    """One batch message naming ``batch``, processed to the end with what the interactive queue gets."""
    harness.broker.enqueue(batch_message(SPEC, [Publish(i, 0, "noop") for i in batch]))
    harness.broker.join(SPEC.queue)
    harness.broker.join(SPEC.interactive_queue)
    harness.worker.join()


def test_an_interactive_message_runs_between_a_batchs_items_in_the_thread_running_the_batch(
    harness: BatchHarness,
) -> None:
    # Given a batch message of four items on a worker with one thread, and a one-item job
    batch = harness.submit(4)
    (urgent,) = harness.submit(1)

    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id == batch[0]:
            # When the one-item job's interactive message reaches the worker during the batch's first item
            _send_interactive(harness, urgent)
        return {"item": ctx.item_id}

    harness.body = body
    _deliver_with_interactive(harness, batch)
    # Then it ran right after the item that was running, before the batch's other items
    assert harness.ran == [batch[0], urgent, *batch[1:]]
    # And every item ran once under its own lease and succeeded with its own result
    for i in [*batch, urgent]:
        row = harness.item(i)
        assert row.state == "succeeded" and row.result == {"item": i} and row.attempt == 1, i
        assert len(harness.events("item_claimed", i)) == 1 and len(harness.events("item_succeeded", i)) == 1


def test_a_batch_item_stopped_while_an_interactive_message_ran_does_not_start(harness: BatchHarness) -> None:
    # Given a batch of three items and a one-item job whose interactive message arrives during the first
    batch = harness.submit(3)
    (urgent,) = harness.submit(1)

    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id == batch[0]:
            _send_interactive(harness, urgent)
        if ctx.item_id == urgent:
            # When the batch's job is cancelled while the interactive item runs (a heartbeat tells them)
            store_jobs.cancel(harness.engine, harness.item(batch[0]).job_id)
            harness.lease.heartbeat.beat()
        return {"item": ctx.item_id}

    harness.body = body
    _deliver_with_interactive(harness, batch)
    # Then the interactive item succeeded and the batch's later items never started nor used an attempt
    assert harness.ran == [batch[0], urgent]
    assert harness.item(urgent).state == "succeeded"
    for i in batch[1:]:
        row = harness.item(i)
        assert row.state == "cancelled" and row.attempt == 0, (i, row.state, row.attempt)


def test_a_normal_message_first_in_the_work_queue_waits_for_the_batch_to_finish(
    harness: BatchHarness,
) -> None:
    # Given a batch message of three items on a worker with one thread, and another job's item
    batch = harness.submit(3)
    (other,) = harness.submit(1)

    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id == batch[0]:
            # When that item's *normal* message reaches the head of the work queue during the batch
            harness.broker.enqueue(batch_message(SPEC, [Publish(other, 0, "noop")]))
            wait_for(lambda: _work_queue_holds(harness, 1), 10, what="the normal message queued")
        return {"item": ctx.item_id}

    harness.body = body
    _deliver_with_interactive(harness, batch)
    # Then it is not run between the batch's items (only an interactive message is): it runs after
    assert harness.ran == [*batch, other]
    for i in [*batch, other]:
        row = harness.item(i)
        assert row.state == "succeeded" and row.attempt == 1, i
