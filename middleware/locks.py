"""The ordered photo-lock middleware: which lanes lock their photos, how, and what a conflict costs.

It sits beside ``LeaseMiddleware`` on the broker and owns the lock *policy*:

- **which lanes take which mode**: a lane's declaration (``LaneSpec.lock``: shared for analysis and
  upload, exclusive for exif and rename, none for noop), overridable per lane;
- **ascending order**: an item's photos are locked in ascending photo id, the one global order
  (``store.photo_locks.take`` carries it out);
- **conflict -> defer with backoff**: an item whose photo is held by other work goes back to
  ``pending`` holding nothing, for the lane's ``lock_retry`` doubled per consecutive conflict of
  that item (up to ``max_backoff``), with jitter so that waiting items do not wake in lockstep.

It does not open a transaction of its own: the lease middleware asks it for the item's
``LockRequest`` (``request_for``) and the claim takes the locks in the claim's own transaction, so
an item holds its lease and its locks together or neither (the atomicity the design relies on).
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping

from dramatiq.middleware import Middleware

from store.lanes import NO_LOCK, LaneSpec
from store.photo_locks import LockRequest

__all__ = ["LockMiddleware"]

REMEMBERED = 10_000  # items whose consecutive conflicts a worker process remembers


class LockMiddleware(Middleware):
    def __init__(
        self,
        specs: Mapping[str, LaneSpec],
        *,
        modes: Mapping[str, str] | None = None,
        max_backoff: float = 2.0,
        jitter: float = 0.25,
        rng: Callable[[], float] = random.random,
    ) -> None:
        """``modes``: lane -> ``SHARED``/``EXCLUSIVE``/``NO_LOCK`` overriding the declarations;
        ``jitter``: the retry delay varies by ± that fraction."""
        self.modes = {name: spec.lock for name, spec in specs.items()}
        self.modes.update(modes or {})
        self.max_backoff = max_backoff
        self.jitter = jitter
        self.rng = rng
        self._conflicts: OrderedDict[int, int] = OrderedDict()  # item id -> consecutive conflicts
        self._lock = threading.Lock()

    def mode_of(self, lane: str) -> str:
        return self.modes.get(lane, NO_LOCK)

    def request_for(self, spec: LaneSpec, item_id: int) -> LockRequest | None:
        """The photo locks this item's claim takes, and how long it waits after a conflict."""
        mode = self.mode_of(spec.name)
        if mode == NO_LOCK:
            return None
        with self._lock:
            streak = self._conflicts.get(item_id, 0)
        delay = min(self.max_backoff, spec.lock_retry * (2**streak))
        delay *= 1 + self.jitter * (2 * self.rng() - 1)
        return LockRequest(mode, max(0.0, delay))

    def conflicted(self, item_id: int) -> None:
        """The item's claim met a held lock (it was deferred): its next wait doubles."""
        with self._lock:
            self._conflicts[item_id] = self._conflicts.pop(item_id, 0) + 1
            while len(self._conflicts) > REMEMBERED:
                self._conflicts.popitem(last=False)

    def claimed(self, item_id: int) -> None:
        with self._lock:
            self._conflicts.pop(item_id, None)
