"""Crash attribution (issue 22, 5): a worker's death is charged only to an item claimed alone whose
body had started; the items of a batch message it held, and an item waiting for a CPU slot, lose no
attempt and ride alone next time (``store.sweeper.revoke_expired``, ``store.dispatch.ALONE``,
``actors.lane.in_a_cpu_slot``). Real store, both SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine

from actors.lane import in_a_cpu_slot
from middleware.context import ItemContext, Stopped
from middleware.cpu_slots import SlotGate
from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import ALONE, take_for_dispatch
from store.items import WAITING_ALONE
from store.lanes import lane_spec
from store.sweeper import revoke_expired
from tests.support import events_of, expire_running_leases, item_row, items_of, photo_inputs, wait_for

# One thread in a one-process fleet: a dispatch of a job's first attempts is one batch message.
NOOP = replace(lane_spec("noop", env={}), max_attempts=2, threads=1, fleet_processes=1, batch=16)


def submit(engine: Engine, tmp_path: Path, n: int) -> int:
    return store_jobs.submit(engine, [NOOP], photo_inputs(tmp_path, n)).job_id


def claim_one_batch(engine: Engine, worker: str) -> list[int]:
    """Dispatch the lane (one batch message) and claim that message's items; their ids."""
    published = take_for_dispatch(engine, NOOP)
    assert len({p.group for p in published}) == 1 and published[0].group is not None, published
    pairs = [(p.item_id, p.token) for p in published]
    outcomes = store_items.claim_batch(engine, NOOP, pairs, worker, {})
    assert all(o.lease is not None for o in outcomes)
    return [i for i, _ in pairs]


def test_a_death_in_a_batch_charges_none_of_its_items_and_sends_each_alone_next_time(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job of four photos claimed together from one batch message, on a lane of 2 attempts
    submit(engine, tmp_path, 4)
    items = claim_one_batch(engine, "doomed")
    # When their worker dies (every lease runs out) and the sweeper revokes them
    expire_running_leases(engine)
    assert revoke_expired(engine, {"noop": NOOP}) == (4, 0)
    # Then none was charged: each is pending again with no attempt used, marked to go alone
    for i in items:
        row = item_row(engine, i)
        assert (row.state, row.attempt, row.message_items) == ("pending", 0, ALONE)
        assert events_of(engine, "lease_expired", i)[-1].detail["charged"] is False  # type: ignore[index]
    # And the next dispatch sends each in a message of its own
    again = take_for_dispatch(engine, NOOP)
    assert sorted(p.item_id for p in again) == items and {p.group for p in again} == {None}
    # And when they die again, claimed alone (each body started at once), each death is charged
    for p in again:
        assert store_items.claim(engine, NOOP, p.item_id, p.token, "doomed").lease is not None
    expire_running_leases(engine)
    assert revoke_expired(engine, {"noop": NOOP}) == (4, 0)
    for i in items:
        row = item_row(engine, i)
        assert (row.state, row.attempt) == ("pending", 1)
        assert events_of(engine, "lease_expired", i)[-1].detail["charged"] is True  # type: ignore[index]


def test_a_death_alone_is_charged_and_quarantines_after_the_attempts(engine: Engine, tmp_path: Path) -> None:
    # Given one photo, dispatched and claimed alone, on a lane of 2 attempts
    job = submit(engine, tmp_path, 1)
    # When its worker dies twice while it runs
    for _attempt in range(2):
        [p] = take_for_dispatch(engine, NOOP)
        assert p.group is None
        assert store_items.claim(engine, NOOP, p.item_id, p.token, "doomed").lease is not None
        expire_running_leases(engine)
        revoke_expired(engine, {"noop": NOOP})
    # Then each death was charged and it is quarantined
    [row] = items_of(engine, job)
    assert (row.state, row.attempt) == ("failed", 2)
    assert row.error == "quarantined: killed its worker 2 times"


CPU = replace(NOOP, cpu_bound=True)  # a CPU-bound lane: its work runs in one of the process's CPU slots


class WaitingForASlot:
    """An item of ``CPU`` claimed alone, run by ``actors.lane.in_a_cpu_slot`` in a thread while the
    process's only CPU slot is held (by another item's body): it waits for the slot."""

    def __init__(self, engine: Engine, tmp_path: Path) -> None:
        photos = [store_jobs.PhotoInput(str(tmp_path / "p.jpg"), 1)]
        store_jobs.submit(engine, [CPU], photos)
        [p] = take_for_dispatch(engine, CPU)
        lease = store_items.claim(engine, CPU, p.item_id, p.token, "doomed").lease
        assert lease is not None
        self.item_id = lease.item_id
        self.ctx = ItemContext(lease=lease, spec=CPU, engine=engine, worker="doomed")
        self.gate = SlotGate(1)
        assert self.gate.acquire(blocking=False)  # the slot is taken
        self.started, self.go_on = threading.Event(), threading.Event()
        self.outcome: list[object] = []
        self.thread = threading.Thread(target=self._run)
        self.thread.start()

    def _body(self, ctx: ItemContext) -> str:
        self.started.set()
        assert self.go_on.wait(30)
        return "done"

    def _run(self) -> None:
        try:
            self.outcome.append(in_a_cpu_slot(self.ctx, self._body, alone=True, gate=self.gate))
        except Stopped as exc:
            self.outcome.append(exc)

    def end(self) -> None:
        self.go_on.set()
        self.thread.join(30)


def test_an_item_alone_waiting_for_a_cpu_slot_is_not_charged_for_its_workers_death(
    engine: Engine, tmp_path: Path
) -> None:
    # Given an item claimed alone that waits for its process's only CPU slot
    waiting = WaitingForASlot(engine, tmp_path)
    try:
        wait_for(lambda: item_row(engine, waiting.item_id).message_items == WAITING_ALONE, 10,
                 what="the wait recorded")
        # When its worker dies while it waits (its lease runs out and the sweeper revokes it)
        expire_running_leases(engine)
        assert revoke_expired(engine, {"noop": CPU}) == (1, 0)
        # Then it was not charged: pending with no attempt used, to go alone next time
        row = item_row(engine, waiting.item_id)
        assert (row.state, row.attempt, row.message_items) == ("pending", 0, ALONE)
        assert events_of(engine, "lease_expired", waiting.item_id)[-1].detail["charged"] is False  # type: ignore[index]
    finally:
        # (and had the process lived, the slot coming free finds the lease gone: the body never runs)
        waiting.gate.release()
        waiting.end()
    assert not waiting.started.is_set() and isinstance(waiting.outcome[0], Stopped)


def test_an_item_alone_that_got_its_cpu_slot_is_charged_for_its_workers_death(
    engine: Engine, tmp_path: Path
) -> None:
    # Given an item claimed alone that waited for a CPU slot, got it and started its body
    waiting = WaitingForASlot(engine, tmp_path)
    try:
        wait_for(lambda: item_row(engine, waiting.item_id).message_items == WAITING_ALONE, 10,
                 what="the wait recorded")
        waiting.gate.release()
        assert waiting.started.wait(10)
        assert item_row(engine, waiting.item_id).message_items is None
        # When its worker dies while its body runs
        expire_running_leases(engine)
        assert revoke_expired(engine, {"noop": CPU}) == (1, 0)
        # Then the death is charged to it: its attempt stays used
        row = item_row(engine, waiting.item_id)
        assert (row.state, row.attempt) == ("pending", 1)
        assert events_of(engine, "lease_expired", waiting.item_id)[-1].detail["charged"] is True  # type: ignore[index]
    finally:
        waiting.end()
