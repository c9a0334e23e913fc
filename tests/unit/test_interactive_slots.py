"""Interactive items first in the CPU slots (``middleware.cpu_slots.SlotGate``, issue 24): an item
of a lane's interactive message takes the next free slot before a normal item that asks again at
once; ``ItemContext.interactive`` tells them apart by the thread's current Dramatiq message."""

from __future__ import annotations

import threading
from typing import Any

import dramatiq
from dramatiq.middleware import CurrentMessage

from middleware.context import ItemContext
from middleware.cpu_slots import SlotGate, cpu_slot
from store.items import Lease
from store.lanes import lane_spec
from tests.support import wait_for

ANALYSIS = lane_spec("analysis", env={})
ROUNDS = 20  # the normal thread's release-and-take-again rounds


def _ctx(item_id: int) -> ItemContext:
    lease = Lease(item_id, 1, 1, ANALYSIS.name, 0, item_id, (item_id,), 1, None, {}, [], None)
    return ItemContext(lease=lease, spec=ANALYSIS, engine=None, worker="w")  # type: ignore[arg-type]


def _as_current_message(actor: str | None) -> None:
    """Make a message of ``actor`` this thread's current message (as Dramatiq's CurrentMessage
    middleware does before the actor runs); None: no message."""
    message = None
    if actor is not None:
        message = dramatiq.Message(queue_name="q", actor_name=actor, args=(1, 1), kwargs={}, options={})
    CurrentMessage._MESSAGE.set(message)


def _in_thread(actor: str | None, read: Any) -> Any:
    out: list[Any] = []

    def run() -> None:
        _as_current_message(actor)
        out.append(read())

    t = threading.Thread(target=run)
    t.start()
    t.join(timeout=10)
    return out[0]


def test_an_item_is_interactive_when_its_message_is_of_the_lanes_interactive_actor() -> None:
    ctx = _ctx(1)
    # Given a thread running the interactive actor's message, the lane actor's, and none
    # Then only the first sees its item as interactive
    assert _in_thread(ANALYSIS.interactive_actor, lambda: ctx.interactive) is True
    assert _in_thread(ANALYSIS.actor, lambda: ctx.interactive) is False
    assert _in_thread(None, lambda: ctx.interactive) is False


def test_an_interactive_item_takes_the_slot_before_a_normal_thread_that_asks_again_at_once() -> None:
    # Given one CPU slot, a normal analysis thread that holds it and then, ROUNDS times, releases it
    # and asks for it again at once (a batch message's items), and an interactive item waiting for it
    gate = SlotGate(1)
    start = threading.Barrier(2)
    normal_inside = threading.Event()
    interactive_waits = threading.Event()
    order: list[str] = []
    errors: list[BaseException] = []
    normal_ctx, interactive_ctx = _ctx(1), _ctx(2)

    def normal() -> None:
        try:
            _as_current_message(ANALYSIS.actor)
            start.wait(timeout=10)
            for i in range(ROUNDS):
                with cpu_slot(normal_ctx, gate):
                    order.append(f"normal {i}")
                    if i == 0:
                        normal_inside.set()
                        assert interactive_waits.wait(timeout=20), "the interactive item never waited"
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    def interactive() -> None:
        try:
            _as_current_message(ANALYSIS.interactive_actor)
            start.wait(timeout=10)
            assert normal_inside.wait(timeout=20), "the normal thread never took the slot"
            with cpu_slot(interactive_ctx, gate):
                order.append("interactive")
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=normal), threading.Thread(target=interactive)]
    for t in threads:
        t.start()
    wait_for(lambda: gate.waiting_interactive() == 1 or errors, timeout=20, what="the interactive waiter")

    # When the normal thread releases the slot and asks for it again, round after round
    interactive_waits.set()
    for t in threads:
        t.join(timeout=30)

    # Then the interactive item had the slot right after the normal thread's first round, and the
    # normal thread did all its rounds after it
    assert not any(t.is_alive() for t in threads), "a thread never finished"
    assert not errors
    assert order[:3] == ["normal 0", "interactive", "normal 1"]
    assert len(order) == ROUNDS + 1
    # And every slot is free again
    assert gate.acquire(blocking=False)
    gate.release()


# -- the look between a batch's items (issue 32) -----------------------------------------------------
class _CountingLock:
    """A lock that counts its acquisitions (a work queue's mutex, the gate module's lock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.taken = 0

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.taken += 1
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    __enter__ = acquire

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Thread:
    """What ``middleware.interactive`` reads of a Dramatiq worker thread: its work queue."""

    broker = None

    def __init__(self) -> None:
        import queue

        self.work_queue: queue.PriorityQueue[Any] = queue.PriorityQueue()
        self.mutex = _CountingLock()
        self.work_queue.mutex = self.mutex  # type: ignore[assignment]
        for name in ("not_empty", "not_full", "all_tasks_done"):
            setattr(self.work_queue, name, threading.Condition(self.mutex))  # type: ignore[arg-type]


def _entry(priority: int, queue_name: str) -> Any:
    from dramatiq.broker import MessageProxy
    from dramatiq.worker import _WorkQueueItem

    message = dramatiq.Message(queue_name=queue_name, actor_name="a", args=(), kwargs={}, options={})
    return _WorkQueueItem(priority, MessageProxy(message))


def test_between_items_no_lock_is_taken_while_no_interactive_message_waits(monkeypatch: Any) -> None:
    from middleware import cpu_slots, interactive
    from store.lanes import NORMAL_PRIORITY

    # Given a worker thread whose work queue is empty, then holds a normal message; the process's
    # CPU gate made (its module lock counted from now on)
    thread = _Thread()
    monkeypatch.setattr(interactive, "current_worker_thread", lambda: thread)
    ran: list[Any] = []
    monkeypatch.setattr(interactive, "process_inline", lambda t, entry: ran.append(entry))
    monkeypatch.setattr(interactive, "disarm_time_limit", lambda broker: None)
    cpu_slots.process_gate()
    gate_lock = _CountingLock()
    monkeypatch.setattr(cpu_slots, "_lock", gate_lock)

    # When the batch's items end one after another, and a CPU-bound item asks whether to keep its slot
    for _ in range(100):
        assert not interactive.run_waiting_interactive()
        assert not interactive.interactive_waits("photojobs.analysis.interactive")
    thread.work_queue.put(_entry(NORMAL_PRIORITY, "photojobs.analysis"))
    taken_by_put = thread.mutex.taken
    for _ in range(100):
        assert not interactive.run_waiting_interactive()
        assert not interactive.interactive_waits("photojobs.analysis.interactive")

    # Then no lock was taken for those looks (one cheap check per item) and nothing ran
    assert thread.mutex.taken == taken_by_put and gate_lock.taken == 0
    assert ran == []

    # And an interactive message first is still seen, taken under the queue's lock and run
    thread.work_queue.put(_entry(0, "photojobs.analysis.interactive"))
    assert interactive.interactive_waits("photojobs.analysis.interactive")
    assert interactive.run_waiting_interactive()
    assert [e.message.queue_name for e in ran] == ["photojobs.analysis.interactive"]
    assert thread.work_queue.qsize() == 1
