"""CPU slots: how many items of CPU-bound lanes do their work at once in one worker process.

A worker process runs ``--threads`` items at a time, which suits lanes that wait (exiftool, S3,
the disk). A CPU-bound lane (``LaneSpec.cpu_bound``: analysis) gains nothing from more of its items
running than there are cores for them: on a 2-core machine with 2 processes x 4 threads, eight
decodes at once were preempted ~15 times each and cost ~25 % more CPU than one per core
(README, Benchmarks). So such an item takes one of the process's ``PHOTOJOBS_CPU_SLOTS`` slots for
its actor's work; its claim and its finish stay outside, so one thread's store work overlaps another
thread's decoding. While it waits for a slot it holds its lease (renewed by the heartbeat as ever)
and looks at its stop requests: a cancelled, paused or lost item stops waiting at once.

Interactive items first (issue 24): while an item of a lane's interactive message
(``ItemContext.interactive``) waits for a slot, no other item takes one; a batch thread that releases
its slot after each item and asks again at once no longer starves the interactive item for a whole
batch. Interactive items take turns among themselves.

A slot kept for an interactive message: a thread running a batch that sees an interactive message
first in its work queue as an item ends keeps its slot (``keep``) instead of releasing it, runs
that message between its items (``middleware.interactive``), whose item takes the kept slot
(``take_kept``) instead of waiting for one: the other threads' normal items, waiting for the slot,
do not get it first. A kept slot that no item took is released after the batch's next pause
(``release_kept``).

``photojobs worker`` and ``photojobs run`` set ``PHOTOJOBS_CPU_SLOTS`` to the usable cores divided by
their worker processes (at least 1); a bare ``dramatiq actors`` process defaults to its usable cores.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from store.lanes import cpu_slots

from .context import ItemContext

WAIT_STEP = 0.1  # seconds between looks at the item's stop requests while it waits for a slot

_lock = threading.Lock()
_gate: SlotGate | None = None


class SlotGate:
    """A process's CPU slots: a bounded semaphore whose interactive waiters go first."""

    def __init__(self, slots: int) -> None:
        if slots < 1:
            raise ValueError("a gate needs at least one slot")
        self.slots = slots
        self._free = slots
        self._interactive_waiting = 0
        self._cond = threading.Condition(threading.Lock())
        self._kept = threading.local()  # this thread's slot kept for the interactive message it runs next

    def _may_take(self, interactive: bool) -> bool:
        return self._free > 0 and (interactive or self._interactive_waiting == 0)

    def take(
        self, *, interactive: bool, check: Callable[[], None] = lambda: None, step: float = WAIT_STEP
    ) -> None:
        """Wait for a slot and take it; an ``interactive`` waiter keeps every other one waiting
        until it has its slot. ``check()`` every ``step`` seconds while waiting: what it raises
        ends the wait without a slot."""
        with self._cond:
            if interactive:
                self._interactive_waiting += 1
            try:
                while not self._cond.wait_for(lambda: self._may_take(interactive), step):
                    check()
                self._free -= 1
            finally:
                if interactive:
                    self._interactive_waiting -= 1
                    if self._interactive_waiting == 0:
                        self._cond.notify_all()  # normal waiters may take the free slots now

    def acquire(self, blocking: bool = True, timeout: float | None = None) -> bool:
        """A normal item's slot, like ``threading.Semaphore.acquire``: False when none is free
        (or an interactive item waits for one) within ``timeout``."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._may_take(False), timeout if blocking else 0):
                return False
            self._free -= 1
            return True

    def release(self) -> None:
        with self._cond:
            if self._free >= self.slots:
                raise ValueError("a CPU slot released more often than taken")
            self._free += 1
            self._cond.notify_all()

    def keep(self) -> None:
        """Instead of ``release``: this thread keeps its slot for the interactive message it is about to
        run (``take_kept``); ``release_kept`` gives it back if none takes it."""
        if getattr(self._kept, "slot", False):
            raise ValueError("this thread already keeps a CPU slot")
        self._kept.slot = True

    def take_kept(self) -> bool:
        """Take the slot this thread kept, if it kept one: True, and the caller holds (and will
        release) a slot without waiting."""
        if getattr(self._kept, "slot", False):
            self._kept.slot = False
            return True
        return False

    def release_kept(self) -> None:
        """Release the slot this thread kept, if no item took it."""
        if self.take_kept():
            self.release()

    def waiting_interactive(self) -> int:
        """How many interactive items wait for a slot now."""
        with self._cond:
            return self._interactive_waiting


def process_gate() -> SlotGate:
    """This process's slots (``PHOTOJOBS_CPU_SLOTS``, read once; checked at start by
    ``photojobs.config.Settings.from_env``). Made once under a lock, then read without one: it is
    asked for around every item of a CPU-bound lane."""
    global _gate
    gate = _gate
    if gate is not None:
        return gate
    with _lock:
        if _gate is None:
            _gate = SlotGate(cpu_slots())
        return _gate


def release_kept_slot() -> None:
    """Release the slot this thread kept for an interactive message, if it kept one (only a
    CPU-bound lane's item keeps one): a look at a thread-local, no lock, when none is kept."""
    gate = _gate
    if gate is not None:
        gate.release_kept()


@contextmanager
def cpu_slot(
    ctx: ItemContext, gate: SlotGate | None = None, *, keep_if: Callable[[], bool] | None = None
) -> Iterator[None]:
    """Hold one of the process's CPU slots (``gate``) while the body runs, when the item's lane is
    CPU-bound, an interactive item before the others (or in the slot this thread kept for it);
    raise ``Stopped`` instead of waiting on when the item must stop. After the body, the slot is
    kept for this thread (``SlotGate.keep``) when ``keep_if()`` says so, else released."""
    if not ctx.spec.cpu_bound:
        yield
        return
    gate = gate or process_gate()
    if not gate.take_kept():
        gate.take(interactive=ctx.interactive, check=ctx.check)
    try:
        yield
    finally:
        if keep_if is not None and keep_if():
            gate.keep()
        else:
            gate.release()
