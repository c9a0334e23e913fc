"""What a running actor sees of its item: its lease, parameters, checkpoint and stop requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from dramatiq.middleware import CurrentMessage
from sqlalchemy import Engine

from store.fencing import FencedSession, fenced
from store.items import Lease, mark_waiting, save_checkpoint
from store.lanes import LaneSpec

# Why a running item was asked to stop.
STOP_CANCEL = "cancel"
STOP_PAUSE = "pause"
STOP_LOST = "lost"  # the lease is gone: another worker may own the item now
STOP_SHUTDOWN = "shutdown"  # the worker process is shutting down
STOP_DEFER = "defer"  # the item cannot go on before another item of its job: pending again, later


class Stopped(Exception):  # noqa: N818 - it is a signal, not an error
    """Raised by ``ItemContext.check()`` at a safe point when the item must stop."""

    def __init__(self, kind: str, reason: str) -> None:
        self.kind = kind
        self.reason = reason
        super().__init__(f"stopped ({kind}): {reason}")


class Deferred(Stopped):
    """Raised by an item that must wait for another item of its job (an undo moving a photo back
    into a name another photo of the job still holds, until that photo's own undo moves it away):
    the item goes back to ``pending`` for ``delay`` seconds, its attempt given back, holding nothing."""

    def __init__(self, reason: str, delay: float) -> None:
        super().__init__(STOP_DEFER, reason)
        self.delay = delay


@dataclass
class ItemContext:
    lease: Lease
    spec: LaneSpec
    engine: Engine
    worker: str
    started: float = field(default_factory=time.monotonic)
    last_renewed: float = field(default_factory=time.monotonic)
    result: Any = None
    at_finish: list[Any] = field(default_factory=list)  # callables(session) run in the final commit
    # In a batch message (``middleware.batch``): whether the item's turn came, and what it raised.
    ran: bool = False
    error: BaseException | None = None
    _stop_kind: str | None = None
    _stop_reason: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # -- what the actor reads -------------------------------------------------
    @property
    def item_id(self) -> int:
        return self.lease.item_id

    @property
    def token(self) -> int:
        return self.lease.token

    @property
    def params(self) -> dict[str, Any]:
        return self.lease.params

    def param(self, key: str, default: Any = None) -> Any:
        return self.lease.params.get(key, default)

    @property
    def photo_path(self) -> str | None:
        return self.lease.photo_path

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def interactive(self) -> bool:
        """Whether the item came in its lane's interactive message (``LaneSpec.interactive_actor``:
        a small or interactive job, ``store.dispatch``), read from this thread's current message
        (Dramatiq's ``CurrentMessage`` middleware; the item runs in the thread that claimed it)."""
        message = CurrentMessage.get_current_message()
        return message is not None and message.actor_name == self.spec.interactive_actor

    @property
    def saved_checkpoint(self) -> dict[str, Any] | None:
        """The checkpoint a previous attempt saved, if any."""
        return self.lease.checkpoint

    # -- stop requests ---------------------------------------------------------
    def request_stop(self, kind: str, reason: str) -> None:
        with self._lock:
            # A lost lease overrides everything; otherwise the first request wins.
            if self._stop_kind is None or kind == STOP_LOST:
                self._stop_kind, self._stop_reason = kind, reason

    @property
    def stop_kind(self) -> str | None:
        return self._stop_kind

    @property
    def stop_reason(self) -> str:
        return self._stop_reason

    def check(self) -> None:
        """A safe point: raise ``Stopped`` if the item must stop."""
        if self._stop_kind is not None:
            raise Stopped(self._stop_kind, self._stop_reason)

    # -- fenced writes -------------------------------------------------------
    @contextmanager
    def fenced(self, what: str = "commit") -> Iterator[FencedSession]:
        """A transaction that commits only while this lease holds (else ``StaleLease``)."""
        with fenced(self.engine, self.lease.item_id, self.lease.token, worker=self.worker, what=what) as s:
            yield s

    def waiting_for_a_slot(self, waiting: bool) -> bool:
        """Record in the store that this item (claimed alone) waits for a CPU slot, or that its
        body starts now (``store.items.mark_waiting``): a death of its worker while it waits is not
        charged to it. False when its lease has moved on."""
        return mark_waiting(self.engine, self.lease, waiting)

    def checkpoint(self, data: dict[str, Any]) -> None:
        """Save progress; the next attempt reads it back as ``saved_checkpoint``."""
        with self.fenced("checkpoint") as s:
            save_checkpoint(s, self.lease, data)


_local = threading.local()


def current() -> ItemContext:
    """The context of the item this worker thread is running."""
    ctx = getattr(_local, "ctx", None)
    if ctx is None:
        raise RuntimeError("no item is running in this thread (is the LeaseMiddleware installed?)")
    return ctx


# What each worker thread of this process runs now: thread id -> (thread name, item id, since as
# ``time.monotonic()``). Read once per heartbeat (``running_now``) for the worker registry, so the
# console names the job and item each busy thread runs; no store write of its own.
_running: dict[int, tuple[str, int, float]] = {}
_running_lock = threading.Lock()


def set_current(ctx: ItemContext | None) -> None:
    _local.ctx = ctx
    ident = threading.get_ident()
    with _running_lock:
        if ctx is None:
            _running.pop(ident, None)
        else:
            _running[ident] = (threading.current_thread().name, ctx.item_id, time.monotonic())


def running_now() -> list[dict[str, Any]]:
    """Each busy thread of this process: ``{"thread", "item", "age"}`` (seconds it has run the item)."""
    now = time.monotonic()
    with _running_lock:
        rows = list(_running.values())
    return [
        {"thread": name, "item": item, "age": round(now - since, 2)} for name, item, since in sorted(rows)
    ]


def peek_current() -> ItemContext | None:
    return getattr(_local, "ctx", None)


def set_batch(ctxs: list[ItemContext] | None) -> None:
    """The items of the batch message this worker thread is processing (claimed together)."""
    _local.batch = ctxs


def current_batch() -> list[ItemContext] | None:
    """The claimed items of this thread's batch message; None for a message naming one item."""
    return getattr(_local, "batch", None)
