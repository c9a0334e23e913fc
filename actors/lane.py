"""``lane_actor``: declare a Dramatiq actor for a lane; the function receives its ``ItemContext``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dramatiq

from middleware.batch import EXPECTED_RACES, run_batch
from middleware.context import STOP_LOST, ItemContext, Stopped, current, current_batch
from middleware.cpu_slots import SlotGate, cpu_slot, process_gate
from middleware.dramatiq_compat import restart_time_limit
from middleware.interactive import interactive_waits, run_waiting_interactive
from photos.errors import PhotoError
from store.lanes import INTERACTIVE_PRIORITY, NORMAL_PRIORITY, lane_spec

from .undo import undoable

THROWS = (PhotoError, Stopped)
#: What the actors declare to Dramatiq (logged without a traceback): the permanent failures, and
#: the expected races, which the finish retries (middleware.finishing)
ACTOR_THROWS = (*THROWS, *EXPECTED_RACES)
log = logging.getLogger("photojobs.lane")


def in_a_cpu_slot(
    ctx: ItemContext,
    fn: Callable[[ItemContext], Any],
    *,
    alone: bool,
    gate: SlotGate | None = None,
    keep_if: Callable[[], bool] | None = None,
) -> Any:
    """``fn(ctx)``, in one of the process's CPU slots when the lane is CPU-bound
    (``middleware.cpu_slots``). An item claimed ``alone`` (not from a batch message, whose items the
    store already knows may be waiting) that finds every slot taken records that it waits before it
    waits, and that its body starts once it has a slot (``ItemContext.waiting_for_a_slot``): its
    worker's death while it waits is then not charged to it (``store.sweeper.revoke_expired``).
    An item of a batch keeps its slot for the interactive message its thread runs next when
    ``keep_if()`` says so (``middleware.interactive``); an item given a kept slot does not wait."""
    if not ctx.spec.cpu_bound:
        return fn(ctx)
    gate = gate or process_gate()
    if alone and gate.take_kept():
        try:
            return fn(ctx)
        finally:
            gate.release()
    if not alone:
        with cpu_slot(ctx, gate, keep_if=keep_if):
            return fn(ctx)
    if not gate.acquire(blocking=False):
        marked = _mark(ctx, waiting=True)
        with cpu_slot(ctx, gate):
            if marked and not ctx.waiting_for_a_slot(False):
                ctx.request_stop(STOP_LOST, "lease lost while waiting for a CPU slot")
                ctx.check()
            return fn(ctx)
    try:
        return fn(ctx)
    finally:
        gate.release()


def _mark(ctx: ItemContext, *, waiting: bool) -> bool:
    """``ctx.waiting_for_a_slot(waiting)``; a store that does not answer only costs the attribution
    (a death while it waits is charged, as before), not the item."""
    try:
        return ctx.waiting_for_a_slot(waiting)
    except Exception:  # noqa: BLE001 - logged; the item goes on
        log.warning("could not record that item %s waits for a CPU slot", ctx.item_id, exc_info=True)
        return False


def lane_actor(name: str) -> Callable[[Callable[[ItemContext], Any]], dramatiq.Actor]:
    spec = lane_spec(name)

    def declare(fn: Callable[[ItemContext], Any]) -> dramatiq.Actor:
        fn = undoable(fn)  # an item of an undo job reverses the lane's effects instead (actors.undo)
        def work_in_batch(ctx: ItemContext) -> Any:
            keep = lambda: interactive_waits(ctx.spec.interactive_queue)  # noqa: E731 - the slot's lane only
            return in_a_cpu_slot(ctx, fn, alone=False, keep_if=keep)

        def run(*args: int) -> None:
            batch = current_batch()
            if batch is not None:  # a batch message: every claimed item in turn (middleware.batch)
                try:
                    run_batch(
                        batch,
                        work_in_batch,
                        restart_clock=restart_clock,
                        between=run_waiting_interactive,
                        throws=THROWS,
                    )
                finally:
                    if spec.cpu_bound:
                        process_gate().release_kept()  # kept for an interactive message an interrupt cut off
                return
            ctx = current()
            if ctx.item_id != args[0]:
                raise RuntimeError("the middleware claimed another item than the message names")
            ctx.result = in_a_cpu_slot(ctx, fn, alone=True)  # committed by the middleware through the fence

        def restart_clock(ctx: ItemContext) -> None:
            """Each item of a batch gets the lane's whole time limit (Dramatiq's TimeLimit counts
            from the message's start)."""
            restart_time_limit(actor.broker, int(ctx.spec.time_limit * 1000))

        run.__name__ = run.__qualname__ = spec.actor
        run.__doc__ = fn.__doc__
        actor = dramatiq.actor(
            run,
            actor_name=spec.actor,
            queue_name=spec.queue,
            priority=NORMAL_PRIORITY,
            time_limit=int(spec.time_limit * 1000),
            throws=ACTOR_THROWS,
        )
        # The same work for the lane's interactive queue (``store.dispatch``: small or interactive
        # jobs while the lane is busy), first among the messages a worker has fetched.
        dramatiq.actor(
            run,
            actor_name=spec.interactive_actor,
            queue_name=spec.interactive_queue,
            priority=INTERACTIVE_PRIORITY,
            time_limit=int(spec.time_limit * 1000),
            throws=ACTOR_THROWS,
        )
        return actor

    return declare
