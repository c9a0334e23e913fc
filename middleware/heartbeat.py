"""One heartbeat thread per worker process renews all of the process's leases in one statement."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

from sqlalchemy import Engine

from store.errors import ConfigError
from store.items import renew
from store.lanes import LaneSpec

from .context import STOP_CANCEL, STOP_LOST, STOP_PAUSE, ItemContext

log = logging.getLogger("photojobs.heartbeat")

# Held while a beat's transaction is open. A test failpoint that freezes the process takes it first,
# so the freeze never happens inside a heartbeat transaction (on SQLite that would hold the one
# write lock and stall every other process until the frozen one resumes).
BEAT_LOCK = threading.Lock()


HEARTBEAT_VARIABLE = "PHOTOJOBS_HEARTBEAT_INTERVAL"
BEATS_PER_TTL = 4  # the derived interval: a quarter of the shortest TTL (3 beats may fail in a row)


def heartbeat_interval_for(specs: Iterable[LaneSpec], explicit: float | None = None) -> float:
    """The interval of a worker serving ``specs``: ``explicit`` (``PHOTOJOBS_HEARTBEAT_INTERVAL``)
    when set, else a quarter of the shortest lease TTL among the lanes it serves, so a lane whose
    ``PHOTOJOBS_LANE_<L>_LEASE_TTL`` is shorter than the global TTL is renewed in time too."""
    if explicit is not None:
        return explicit
    ttls = [s.lease_ttl for s in specs]
    return min(ttls) / BEATS_PER_TTL if ttls else 10.0 / BEATS_PER_TTL


def _ttl_variable(lane: str, env: Mapping[str, str]) -> str:
    key = f"PHOTOJOBS_LANE_{lane.upper()}_LEASE_TTL"
    if key in env:
        return key
    return "PHOTOJOBS_LEASE_TTL" if "PHOTOJOBS_LEASE_TTL" in env else f"{key} (default)"


def check_heartbeat(
    specs: Mapping[str, LaneSpec], explicit: float | None, env: Mapping[str, str] | None = None
) -> None:
    """Refuse lease settings that cannot work: a TTL that is not positive, or an explicit heartbeat
    interval that is not below half of every lane's TTL (a beat may be late by one interval; two
    missed would lose the lease). Raises ``ConfigError`` naming the variable to change."""
    env = env or {}
    for spec in specs.values():
        if not spec.lease_ttl > 0:
            raise ConfigError(
                _ttl_variable(spec.name, env), f"lease TTL {spec.lease_ttl:g} s must be positive"
            )
    if explicit is None:
        return
    for spec in sorted(specs.values(), key=lambda s: s.lease_ttl):
        if not explicit < spec.lease_ttl / 2:
            raise ConfigError(
                HEARTBEAT_VARIABLE,
                f"{explicit:g} s is not below half of lane {spec.name}'s lease TTL of {spec.lease_ttl:g} s "
                f"({_ttl_variable(spec.name, env)}); every lease would be lost between beats. Set it "
                f"below {spec.lease_ttl / 2:g} s, or leave it unset to use a quarter of the shortest TTL",
            )


class Heartbeat:
    """Renews every running item's lease each ``interval`` seconds, guarded by fencing token.

    A lease the store no longer grants, or one not renewed for a whole TTL (database unreachable),
    is reported to its actor as lost; a job's cancel or pause request is passed on the same way.
    The thread does I/O, not image work, so a CPU-bound actor cannot starve it for long: the GIL
    is handed over every ``sys.getswitchinterval()`` (5 ms).
    """

    def __init__(self, engine: Engine, interval: float, on_beat: Callable[[int], None] | None = None) -> None:
        """``on_beat(items held)``: called after every beat, busy or idle (the worker registry)."""
        self.engine = engine
        self.interval = interval
        self.on_beat = on_beat
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
            if self.on_beat is not None:
                self.on_beat(len(self.running()))

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
