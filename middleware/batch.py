"""Running a batch message's items: one after another in the worker thread that claimed them.

A lane message may name several items (``store.lanes.LaneSpec.batch``): the lease middleware claims
them in one transaction and finishes them in one transaction, and in between the lane's actor runs
each in turn through ``run_batch``. Each item keeps what a message of its own gives it: its own
``ItemContext`` (lease, parameters, checkpoint, stop requests), its own time limit (the clock
restarts at each item), and its own outcome — what it returned or raised is recorded on its
context instead of ending the message, so one bad photo fails alone. An item asked to stop before
its turn (its job cancelled or paused, its lease lost, the worker shutting down) does not start.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from dramatiq.middleware.threading import Interrupt

from store.intents import TargetTaken

from .context import ItemContext, Stopped, set_current

log = logging.getLogger("photojobs.batch")

#: An expected race: another item took the target name first (the store refused the intent, or
#: the name was taken on disk: nothing is ever clobbered). The item is retried (its next attempt
#: finds the target settled); logged as one warning line, with no traceback logged or kept.
EXPECTED_RACES: tuple[type[BaseException], ...] = (TargetTaken, FileExistsError)


def run_batch(
    batch: list[ItemContext],
    body: Callable[[ItemContext], Any],
    *,
    restart_clock: Callable[[ItemContext], None] | None = None,
    between: Callable[[], object] | None = None,
    throws: tuple[type[BaseException], ...] = (),
) -> None:
    """Run ``body`` for each item of ``batch`` in order, recording each one's outcome on its
    context (``result``, or ``error``); ``restart_clock(ctx)`` before each item (its time limit);
    ``between()`` after each item (``middleware.interactive``: an interactive message that waits
    runs there).
    ``ctx.ran`` is set only when the item's body starts: an item stopped before its turn, or left
    behind by an interrupt between items, has ``ran`` False and gives its attempt back."""
    try:
        for ctx in batch:
            if ctx.stop_kind is not None:
                ctx.error = Stopped(ctx.stop_kind, ctx.stop_reason)  # never started: ``ran`` stays False
                continue
            set_current(ctx)
            if restart_clock is not None:
                # Outside the item's ``try``: an interrupt here (a time limit that fired between
                # items, a shutdown) ends the message before this item starts; it and the items
                # after it are released by the finish (``ran`` False), no attempt used.
                restart_clock(ctx)
            try:
                ctx.ran = True  # set only as the body starts (an item whose turn never came is released)
                ctx.result = body(ctx)
            except (Exception, Interrupt) as exc:  # noqa: BLE001 - the item's outcome, not the batch's
                ctx.error = exc
                if isinstance(exc, EXPECTED_RACES):
                    log.warning("item %s met a race, retried: %s: %s", ctx.item_id, type(exc).__name__, exc)
                elif isinstance(exc, throws):
                    log.warning("item %s failed with expected exception %s", ctx.item_id, type(exc).__name__)
                else:
                    log.error("item %s failed with unhandled exception", ctx.item_id, exc_info=True)
            if between is not None:
                between()  # the next item's stop requests are read after it
    finally:
        set_current(None)
