"""CPU slots: how many items of CPU-bound lanes do their work at once in one worker process.

A worker process runs ``--threads`` items at a time, which suits lanes that wait (exiftool, S3,
the disk). A CPU-bound lane (``LaneSpec.cpu_bound``: analysis) gains nothing from more of its items
running than there are cores for them: on a 2-core machine with 2 processes x 4 threads, eight
decodes at once were preempted ~15 times each and cost ~25 % more CPU than one per core
(README, Benchmarks). So such an item takes one of the process's ``PHOTOJOBS_CPU_SLOTS`` slots for
its actor's work; its claim and its finish stay outside, so one thread's store work overlaps another
thread's decoding. While it waits for a slot it holds its lease (renewed by the heartbeat as ever)
and looks at its stop requests: a cancelled, paused or lost item stops waiting at once.

``photojobs worker`` and ``photojobs run`` set ``PHOTOJOBS_CPU_SLOTS`` to the usable cores divided by
their worker processes (at least 1); a bare ``dramatiq actors`` process defaults to its usable cores.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from store.lanes import cpu_slots

from .context import ItemContext

WAIT_STEP = 0.1  # seconds between looks at the item's stop requests while it waits for a slot

_lock = threading.Lock()
_gate: threading.BoundedSemaphore | None = None


def process_gate() -> threading.BoundedSemaphore:
    """This process's slots (``PHOTOJOBS_CPU_SLOTS``, read once; checked at start by
    ``photojobs.config.Settings.from_env``)."""
    global _gate
    with _lock:
        if _gate is None:
            _gate = threading.BoundedSemaphore(cpu_slots())
        return _gate


@contextmanager
def cpu_slot(ctx: ItemContext, gate: threading.BoundedSemaphore | None = None) -> Iterator[None]:
    """Hold one of the process's CPU slots (``gate``) while the body runs, when the item's lane is
    CPU-bound; raise ``Stopped`` instead of waiting on when the item must stop."""
    if not ctx.spec.cpu_bound:
        yield
        return
    gate = gate or process_gate()
    while not gate.acquire(timeout=WAIT_STEP):
        ctx.check()
    try:
        yield
    finally:
        gate.release()
