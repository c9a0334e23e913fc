"""CPU slots (``middleware.cpu_slots``): a CPU-bound lane's work runs in one of the worker
process's slots; other lanes are not held back; a stopped item stops waiting for a slot."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from middleware.context import STOP_CANCEL, ItemContext, Stopped
from middleware.cpu_slots import SlotGate, cpu_slot
from photojobs.cli_support import worker_env
from store.errors import ConfigError
from store.items import Lease
from store.lanes import cpu_slots, lane_spec, usable_cores

ANALYSIS = lane_spec("analysis", env={})
UPLOAD = lane_spec("upload", env={})
THREADS = 3


def _ctx(spec: Any, item_id: int) -> ItemContext:
    lease = Lease(item_id, 1, 1, spec.name, 0, item_id, (item_id,), 1, None, {}, [], None)
    return ItemContext(lease=lease, spec=spec, engine=None, worker="w")  # type: ignore[arg-type]


def _run_together(
    spec: Any, gate: SlotGate, inside: Any
) -> tuple[int, list[BaseException]]:
    """THREADS items of ``spec`` released at once by a barrier; the most found inside at once."""
    start = threading.Barrier(THREADS)
    lock = threading.Lock()
    now = [0, 0]  # inside now, most at once
    errors: list[BaseException] = []

    def item(i: int) -> None:
        try:
            start.wait(timeout=10)
            with cpu_slot(_ctx(spec, i + 1), gate):
                with lock:
                    now[0] += 1
                    now[1] = max(now[1], now[0])
                inside()
                with lock:
                    now[0] -= 1
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=item, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "an item never finished"
    return now[1], errors


def test_cpu_bound_items_take_turns_in_the_slots() -> None:
    # Given one CPU slot and three analysis items started at the same moment, each working a while
    gate = SlotGate(1)
    work_done = threading.Event()

    # When they run
    most, errors = _run_together(ANALYSIS, gate, lambda: work_done.wait(0.05))

    # Then never more than one was doing its work at once, and all three did it
    assert not errors
    assert most == 1


def test_other_lanes_are_not_held_back_by_the_slots() -> None:
    # Given one CPU slot and three upload items that can only finish once all three are inside
    gate = SlotGate(1)
    all_inside = threading.Barrier(THREADS)

    # When they run
    most, errors = _run_together(UPLOAD, gate, lambda: all_inside.wait(timeout=5))

    # Then all three were inside at once (a slot would have broken the barrier)
    assert not errors
    assert most == THREADS


def test_a_stopped_item_stops_waiting_for_a_slot_and_takes_none() -> None:
    # Given the only slot taken by one analysis item, and a second one waiting for it
    gate = SlotGate(1)
    gate.acquire()
    waiting = _ctx(ANALYSIS, 2)
    outcome: list[BaseException | None] = []

    def second() -> None:
        try:
            with cpu_slot(waiting, gate):
                outcome.append(None)
        except Stopped as exc:
            outcome.append(exc)

    t = threading.Thread(target=second)
    t.start()
    # When the job is cancelled while it waits
    waiting.request_stop(STOP_CANCEL, "job cancelled")
    t.join(timeout=10)

    # Then it raised Stopped without running its work, and the slot is still free for others
    assert not t.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], Stopped) and outcome[0].kind == STOP_CANCEL
    gate.release()
    assert gate.acquire(timeout=0)


def test_slots_default_to_the_cores_shared_out_between_the_fleets_processes() -> None:
    cores = usable_cores()
    # Given no setting, a setting, and bad settings
    assert cpu_slots({}) == cores
    assert cpu_slots({"PHOTOJOBS_CPU_SLOTS": "3"}) == 3
    for bad, why in (("0", ">= 1"), ("-2", ">= 0"), ("two", "not a whole number")):
        with pytest.raises(ConfigError, match=why):
            cpu_slots({"PHOTOJOBS_CPU_SLOTS": bad})
    # And the workers of `photojobs worker --processes P` get cores // P slots each, at least one,
    # unless the operator set them
    assert worker_env(4, {}, processes=1)["PHOTOJOBS_CPU_SLOTS"] == str(cores)
    assert worker_env(4, {}, processes=cores * 4)["PHOTOJOBS_CPU_SLOTS"] == "1"
    assert worker_env(4, {"PHOTOJOBS_CPU_SLOTS": "7"}, processes=2)["PHOTOJOBS_CPU_SLOTS"] == "7"


def test_a_slot_kept_for_an_interactive_item_is_not_taken_by_a_waiting_normal_item() -> None:
    # Given a one-slot gate held by a batch item, and a normal item of another thread waiting for it
    gate = SlotGate(1)
    order: list[str] = []
    waiting = threading.Event()

    def normal() -> None:
        waiting.set()
        with cpu_slot(_ctx(ANALYSIS, 2), gate):
            order.append("normal")

    with cpu_slot(_ctx(ANALYSIS, 1), gate, keep_if=lambda: True):
        other = threading.Thread(target=normal)
        other.start()
        assert waiting.wait(10)
    # When the batch item ends keeping its slot, and the interactive item then runs in this thread
    other.join(timeout=0.3)
    assert other.is_alive(), "the normal item took the kept slot"
    with cpu_slot(_ctx(ANALYSIS, 3), gate):  # takes the kept slot: does not wait
        order.append("interactive")
    # Then the interactive item ran first, and the normal item got the slot after it
    other.join(timeout=10)
    assert order == ["interactive", "normal"]
    assert gate.take_kept() is False


def test_a_kept_slot_no_item_took_is_released() -> None:
    # Given a slot kept for an interactive message that another thread ran instead
    gate = SlotGate(1)
    with cpu_slot(_ctx(ANALYSIS, 1), gate, keep_if=lambda: True):
        pass
    assert gate.acquire(blocking=False) is False
    # When the thread releases what it kept
    gate.release_kept()
    gate.release_kept()  # a second call finds nothing kept
    # Then the slot is free again, once
    assert gate.acquire(blocking=False) is True
    assert gate.acquire(blocking=False) is False
    gate.release()
