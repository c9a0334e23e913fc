"""A worker process's entry in the worker registry (``store.workers``): written once per heartbeat
(busy or idle), at worker boot, and marked stopped on a clean shutdown, so ``/api/workers`` shows
idle workers and tells a dead one (stale: its beats stopped) from a stopped one."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Protocol

from sqlalchemy import Engine

from store import workers as store_workers
from store.errors import error_text

from .context import running_now
from .heartbeat import BEAT_LOCK, Heartbeat

log = logging.getLogger("photojobs.heartbeat")


class Owner(Protocol):
    """What the presence reads from its lease middleware (identity and engine change at boot)."""

    worker: str

    @property
    def engine(self) -> Engine: ...

    @property
    def heartbeat(self) -> Heartbeat: ...


class Presence:
    """Reports the owner's worker to the registry. Never raises: a failed write is logged (at most
    once per failure streak) and retried at the next beat."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner
        self.lanes: list[str] = []
        self.threads: int | None = None
        self.booted = False
        self.stopped = False
        self._failing = False

    def boot(self, lanes: Iterable[str], threads: int | None = None) -> None:
        """The worker booted serving ``lanes`` with ``threads`` worker threads: register it now (not
        one interval later)."""
        self.lanes = sorted(lanes)
        self.threads = threads
        self.booted = True
        self.beat(len(self.owner.heartbeat.running()))

    def beat(self, held: int) -> None:
        """One registry upsert (from the heartbeat thread, after its beat)."""
        if not self.booted:
            return
        self._write(
            lambda: store_workers.beat(
                self.owner.engine,
                self.owner.worker,
                lanes=self.lanes,
                interval=self.owner.heartbeat.interval,
                held=held,
                threads=self.threads,
                running=running_now(),
            )
        )

    def stop(self) -> None:
        """A clean shutdown: mark the worker stopped."""
        if not self.booted or self.stopped:
            return
        self.stopped = True
        held = len(self.owner.heartbeat.running())
        self._write(lambda: store_workers.mark_stopped(self.owner.engine, self.owner.worker, held=held))

    def _write(self, write: Callable[[], object]) -> None:
        try:
            with BEAT_LOCK:
                write()
        except Exception as exc:  # noqa: BLE001 - the registry is informational; work goes on
            if not self._failing:
                log.warning("could not update the worker registry: %s", error_text(exc))
            self._failing = True
        else:
            self._failing = False
