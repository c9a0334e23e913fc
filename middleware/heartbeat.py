"""One heartbeat thread per worker process renews all of the process's leases in one statement."""

from __future__ import annotations

import logging
import threading
import time

from sqlalchemy import Engine

from store.items import renew

from .context import STOP_CANCEL, STOP_LOST, STOP_PAUSE, ItemContext

log = logging.getLogger("photojobs.heartbeat")

# Held while a beat's transaction is open. A test failpoint that freezes the process takes it first,
# so the freeze never happens inside a heartbeat transaction (on SQLite that would hold the one
# write lock and stall every other process until the frozen one resumes).
BEAT_LOCK = threading.Lock()


class Heartbeat:
    """Renews every running item's lease each ``interval`` seconds, guarded by fencing token.

    A lease the store no longer grants, or one not renewed for a whole TTL (database unreachable),
    is reported to its actor as lost; a job's cancel or pause request is passed on the same way.
    The thread does I/O, not image work, so a CPU-bound actor cannot starve it for long: the GIL
    is handed over every ``sys.getswitchinterval()`` (5 ms).
    """

    def __init__(self, engine: Engine, interval: float) -> None:
        self.engine = engine
        self.interval = interval
        self._items: dict[int, ItemContext] = {}
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="photojobs-heartbeat", daemon=True)
        self.beats = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval + 5)

    def add(self, ctx: ItemContext) -> None:
        with self._lock:
            self._items[ctx.item_id] = ctx

    def remove(self, item_id: int) -> None:
        with self._lock:
            self._items.pop(item_id, None)

    def running(self) -> list[ItemContext]:
        with self._lock:
            return list(self._items.values())

    def stop_all(self, kind: str, reason: str) -> None:
        for ctx in self.running():
            ctx.request_stop(kind, reason)

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            self.beat()

    def beat(self) -> None:
        items = self.running()
        if not items:
            return
        try:
            with BEAT_LOCK:
                renewal = renew(self.engine, {c.item_id: c.token for c in items})
        except Exception:  # noqa: BLE001 - a database blip must not kill the heartbeat
            log.warning("heartbeat could not renew %d lease(s)", len(items), exc_info=True)
            now = time.monotonic()
            for ctx in items:
                if now - ctx.last_renewed > ctx.spec.lease_ttl:
                    ctx.request_stop(STOP_LOST, "lease not renewed for a whole TTL (store unreachable)")
            return
        self.beats += 1
        now = time.monotonic()
        for ctx in items:
            if ctx.item_id in renewal.lost:
                ctx.request_stop(STOP_LOST, "lease lost: the item was revoked or moved on")
                continue
            ctx.last_renewed = now
            control = renewal.held.get(ctx.item_id)
            if control == "cancel":
                ctx.request_stop(STOP_CANCEL, "job cancelled")
            elif control == "pause":
                ctx.request_stop(STOP_PAUSE, "job paused")
