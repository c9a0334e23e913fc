"""Interactive messages run between a batch's items, in the thread that runs the batch.

An interactive message (a small or explicitly interactive job's, ``store.priority``) is first in a
worker's work queue (its actor's Dramatiq priority). But when every worker thread is inside a batch
message (up to ``LaneSpec.batch`` items, run one after another), it used to wait for one of them to
finish its whole batch: under a full load a one-photo job took idle + 3-4 items' time.

So a thread running a batch looks at its work queue between two items: if an interactive message
is first, it takes it out and runs it right there (``run_waiting_interactive``), through every
middleware hook as if its own loop had taken it (claim, run, fenced finish, ack), then goes on with
its batch. Nothing is given back: the batch's remaining items keep their leases (the heartbeat
renews them) and their place; they start one interactive message later. One level only: an
interactive message run this way does not run another between its own items.

What the thread's state is, it is again afterwards: the batch and item of this thread
(``middleware.context``), Dramatiq's ``CurrentMessage`` (``process_inline`` runs in a copy of the
context); the time limit is re-armed by the batch's next item (``run_batch``'s ``restart_clock``).
"""

from __future__ import annotations

import logging
import threading

from dramatiq.worker import WorkerThread

from store.lanes import NORMAL_PRIORITY

from .context import current_batch, peek_current, set_batch, set_current
from .cpu_slots import release_kept_slot
from .dramatiq_compat import (
    current_worker_thread,
    disarm_time_limit,
    first_is_below,
    process_inline,
    take_first_below,
)

log = logging.getLogger("photojobs.interactive")
_local = threading.local()
#: Only a message whose Dramatiq priority is below this runs between a batch's items (an interactive
#: one): the one threshold of the fast look, the look with a queue name and the take.
RUNS_INLINE_BELOW = NORMAL_PRIORITY


def _free_worker_thread() -> WorkerThread | None:
    """This thread, if it is a worker thread not already running an interactive message inline."""
    return None if getattr(_local, "inline", False) else current_worker_thread()


def _interactive_first(thread: WorkerThread) -> bool:
    """A look at the first entry of the thread's work queue without its lock: whether it goes
    before the lanes' normal messages. The work queue is a heap whose first element is read here
    as it is at this instant (each list operation is atomic): a message that arrives a moment
    later is seen after the next item, and one another thread takes meanwhile is not taken twice
    (``take_first_below`` looks again under the lock). The one check per item while no
    interactive message waits: no lock, no call into the queue."""
    try:
        return bool(thread.work_queue.queue[0].priority < RUNS_INLINE_BELOW)
    except IndexError:
        return False


def interactive_waits(queue_name: str | None = None) -> bool:
    """Whether this worker thread would run an interactive message (of ``queue_name``, given one)
    after its current item: one is first in its work queue, and the thread is not running one
    already. A CPU-bound item keeps its slot for its own lane's (``middleware.cpu_slots``): an
    interactive message of a lane that waits on exiftool or the network must not hold it idle."""
    thread = _free_worker_thread()
    if thread is None or not _interactive_first(thread):
        return False
    return first_is_below(thread.work_queue, RUNS_INLINE_BELOW, queue_name)


def run_waiting_interactive() -> bool:
    """If this is a worker thread and the first message of its work queue goes before the lanes'
    normal messages, take it and run it now; True if one ran. Called after each item of a batch:
    while no interactive message waits it costs one look at the work queue and one at a
    thread-local (a slot kept by a CPU-bound item whose interactive message another thread took),
    no lock. A CPU slot the item kept for it (``interactive_waits``) is released after, if it did
    not use it."""
    try:
        return _run_waiting_interactive()
    finally:
        release_kept_slot()


def _run_waiting_interactive() -> bool:
    thread = _free_worker_thread()
    if thread is None or not _interactive_first(thread):
        return False
    entry = take_first_below(thread.work_queue, RUNS_INLINE_BELOW)
    if entry is None:
        return False
    batch, item = current_batch(), peek_current()
    disarm_time_limit(thread.broker)  # the batch's last item's clock must not fire in the other message
    set_batch(None)  # the other message's claim sets its own batch or item; none of this one's shows
    set_current(None)
    _local.inline = True
    log.debug("running interactive message %s between the items of a batch", entry.message.message_id)
    try:
        process_inline(thread, entry)
    finally:
        _local.inline = False
        set_batch(batch)
        set_current(item)
    return True
