"""LockMiddleware with Dramatiq's StubBroker: the lock policy (modes, backoff) and its claim
carried out in the lease middleware's claim transaction (real SQLite store; the real-process and
race tests of photo locks are in tests/process and tests/integration)."""

from __future__ import annotations

from dataclasses import replace

import dramatiq
import pytest
from dramatiq.brokers.stub import StubBroker
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from middleware.context import Stopped, current
from middleware.lease import LeaseMiddleware
from middleware.locks import LockMiddleware
from photojobs.broker import lane_message
from photos.errors import PhotoError
from store import items as store_items
from store import jobs as store_jobs
from store.fencing import fenced
from store.lanes import EXCLUSIVE, NO_LOCK, SHARED, all_lanes, lane_spec
from store.models import Event, Item, PhotoLock
from tests.support import events_of, item_row

EXIF = replace(lane_spec("exif", env={}), lock_retry=0.2)
SPECS = {**all_lanes({}), "exif": EXIF}


def no_jitter() -> float:
    return 0.5  # 2 * 0.5 - 1 == 0: the retry delay without jitter


# -- the policy ---------------------------------------------------------------------------------------


def test_each_lane_takes_its_declared_mode_unless_overridden() -> None:
    # Given the lane declarations, and a middleware that overrides one lane
    declared = LockMiddleware(SPECS, rng=no_jitter)
    overridden = LockMiddleware(SPECS, modes={"exif": SHARED, "analysis": NO_LOCK}, rng=no_jitter)
    # When each is asked for its requests
    # Then noop takes none, analysis/upload share, exif/rename are exclusive — unless overridden
    assert declared.request_for(SPECS["noop"], 1) is None
    assert declared.request_for(SPECS["analysis"], 1).mode == SHARED  # type: ignore[union-attr]
    assert declared.request_for(SPECS["upload"], 1).mode == SHARED  # type: ignore[union-attr]
    assert declared.request_for(SPECS["exif"], 1).mode == EXCLUSIVE  # type: ignore[union-attr]
    assert declared.request_for(SPECS["rename"], 1).mode == EXCLUSIVE  # type: ignore[union-attr]
    assert overridden.request_for(SPECS["exif"], 1).mode == SHARED  # type: ignore[union-attr]
    assert overridden.request_for(SPECS["analysis"], 1) is None


def test_conflicts_back_off_doubling_up_to_a_cap_with_jitter_and_reset_on_claim() -> None:
    # Given a middleware without jitter and one with the most jitter either way
    locks = LockMiddleware(SPECS, max_backoff=1.0, rng=no_jitter)
    low = LockMiddleware(SPECS, jitter=0.25, rng=lambda: 0.0)
    high = LockMiddleware(SPECS, jitter=0.25, rng=lambda: 0.999999)

    # When an item meets held locks again and again
    delays = []
    for _ in range(5):
        delays.append(locks.request_for(EXIF, 7).retry_after)  # type: ignore[union-attr]
        locks.conflicted(7)

    # Then its wait doubles from the lane's lock_retry up to the cap; other items are not affected
    assert delays == pytest.approx([0.2, 0.4, 0.8, 1.0, 1.0])
    assert locks.request_for(EXIF, 8).retry_after == pytest.approx(0.2)  # type: ignore[union-attr]
    # And a claim resets it
    locks.claimed(7)
    assert locks.request_for(EXIF, 7).retry_after == pytest.approx(0.2)  # type: ignore[union-attr]
    # And jitter stays within ±25 %
    assert low.request_for(EXIF, 1).retry_after == pytest.approx(0.15)  # type: ignore[union-attr]
    assert high.request_for(EXIF, 1).retry_after == pytest.approx(0.25, rel=1e-4)  # type: ignore[union-attr]


# -- with the lease middleware on a StubBroker -------------------------------------------------------


class Harness:
    """A StubBroker with LockMiddleware and LeaseMiddleware (as photojobs.runtime builds them) and
    an exif-lane actor that does nothing."""

    def __init__(self, engine: Engine, locks: LockMiddleware) -> None:
        self.engine = engine
        self.locks = locks
        self.broker = StubBroker(middleware=[])
        self.lease = LeaseMiddleware(SPECS, engine_factory=lambda: engine, heartbeat_interval=60, locks=locks)
        self.broker.add_middleware(locks)
        self.broker.add_middleware(self.lease)

        def lane_exif(item_id: int, token: int) -> None:
            current().result = {"ok": True}

        dramatiq.actor(
            lane_exif,
            actor_name=EXIF.actor,
            queue_name=EXIF.queue,
            broker=self.broker,
            throws=(PhotoError, Stopped),
        )
        self.broker.emit_after("process_boot")
        self.worker = dramatiq.Worker(self.broker, worker_timeout=50, worker_threads=1)
        self.worker.start()

    def two_jobs_on_one_photo(self) -> tuple[int, int]:
        ids = []
        for _ in range(2):
            job = store_jobs.submit(self.engine, [EXIF], [store_jobs.PhotoInput("/photos/same.jpg")]).job_id
            with Session(self.engine) as s:
                ids.append(s.execute(select(Item.id).where(Item.job_id == job)).scalar_one())
        return ids[0], ids[1]

    def deliver(self, item_id: int, token: int) -> None:
        self.broker.enqueue(lane_message(EXIF, item_id, token))
        self.broker.join(EXIF.queue)
        self.worker.join()

    def item(self, item_id: int) -> Item:
        return item_row(self.engine, item_id)

    def events(self, type: str, item_id: int) -> list[Event]:
        return events_of(self.engine, type, item_id)

    def close(self) -> None:
        self.worker.stop()
        self.lease.heartbeat.stop()


def test_a_held_photo_defers_the_claim_with_the_middlewares_backoff(sqlite_engine: Engine) -> None:
    # Given two jobs' exif items on one photo, the first claimed (holding its exclusive lock)
    h = Harness(sqlite_engine, LockMiddleware(SPECS, rng=no_jitter))
    try:
        first, second = h.two_jobs_on_one_photo()
        held = store_items.claim(sqlite_engine, EXIF, first, 0, "other-worker").lease
        assert held is not None and held.holds_locks

        # When the second item's message is delivered
        h.deliver(second, 0)

        # Then it is deferred holding nothing: pending, no claim, an item_deferred naming the
        # photo and its holder, and its next wait doubled by the lock middleware
        item = h.item(second)
        assert (item.state, item.fencing_token, item.attempt) == ("pending", 0, 0)
        assert h.events("item_claimed", second) == []
        [deferred] = h.events("item_deferred", second)
        assert deferred.detail == {"reason": "photo locked", "photo": held.photo_id, "held_by": first}
        with Session(sqlite_engine) as s:
            holders = s.execute(select(PhotoLock.item_id)).scalars().all()
        assert holders == [first]
        assert h.locks.request_for(EXIF, second).retry_after == pytest.approx(0.4)  # type: ignore[union-attr]

        # When the first finishes and the second is delivered again
        with fenced(sqlite_engine, held.item_id, held.token) as s:
            store_items.succeed(s, held, None, "other-worker")
        with Session(sqlite_engine) as s, s.begin():
            s.execute(update(Item).where(Item.id == second).values(state="queued"))
        h.deliver(second, 0)

        # Then it runs and succeeds, and its backoff is reset
        assert h.item(second).state == "succeeded"
        assert h.locks.request_for(EXIF, second).retry_after == pytest.approx(0.2)  # type: ignore[union-attr]
    finally:
        h.close()


def test_the_claim_takes_the_locks_the_middleware_asks_for_not_the_declaration(sqlite_engine: Engine) -> None:
    # Given a lock middleware that makes exif take shared locks, and one exif item holding a shared lock
    h = Harness(sqlite_engine, LockMiddleware(SPECS, modes={"exif": SHARED}, rng=no_jitter))
    try:
        first, second = h.two_jobs_on_one_photo()
        held = store_items.claim(
            sqlite_engine, EXIF, first, 0, "other-worker", h.locks.request_for(EXIF, first)
        )
        assert held.lease is not None

        # When the second item's message is delivered
        h.deliver(second, 0)

        # Then it runs beside the first (shared with shared), its lock row says shared
        assert h.item(second).state == "succeeded"
        assert h.events("item_deferred", second) == []
        with Session(sqlite_engine) as s:
            modes = s.execute(select(PhotoLock.item_id, PhotoLock.mode)).all()
        assert [tuple(m) for m in modes] == [(first, SHARED)]  # the second's lock was released at its end
    finally:
        h.close()
