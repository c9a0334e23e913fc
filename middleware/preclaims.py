"""Chained claims' leases held for messages still in this worker process's work queue.

A successful finish may claim the next message waiting in the work queue in its own write
transaction (``middleware.finishing``); the lease is held here, renewed by the heartbeat, until the
message's ``before_process_message`` takes it (``middleware.claiming``), or released unused.
"""

from __future__ import annotations

import threading
from typing import Any

import dramatiq

from store.items import Lease
from store.lanes import LaneSpec

from .context import ItemContext
from .dramatiq_compat import put_back, take_waiting
from .finishing import Owner, release
from .validation import lane_of


class Preclaims:
    """Message id -> the context of a lease claimed for it by a finish. Thread-safe."""

    def __init__(self, owner: Owner, *, enabled: bool) -> None:
        self.owner = owner
        self.enabled = enabled  # chained claims on (``LeaseMiddleware(chain_claims=)``, the store allowing)
        self.worker: dramatiq.Worker | None = None  # its work queue holds the messages a finish may claim
        self.chained = 0  # claims made in a finishing transaction (tests, benchmarks)
        self._held: dict[str, ItemContext] = {}
        self._lock = threading.Lock()

    def next_message(self) -> tuple[Any, LaneSpec] | None:
        """The next message of this process's work queue, taken out while its claim is made
        (``put_back`` returns it, in front again), when it is a valid single-item lane message."""
        worker = self.worker
        if not self.enabled or worker is None:
            return None
        entry = take_waiting(worker)
        if entry is None:
            return None
        msg = entry.message
        spec, reason = lane_of(self.owner.by_actor, msg)
        if spec is None or reason or len(msg.args) != 2 or msg.message_id in self._held:
            self.put_back(entry)
            return None
        return entry, spec

    def put_back(self, entry: Any) -> None:
        if self.worker is None:
            raise RuntimeError("internal error: expected a worker to put the message back into")
        put_back(self.worker, entry)

    def hold(self, message_id: str, spec: LaneSpec, lease: Lease) -> None:
        """A chained claim committed: its lease is renewed from now, and the message's
        ``before_process_message`` (in whichever thread takes it) runs with it."""
        owner = self.owner
        if owner.locks is not None:
            owner.locks.claimed(lease.item_id)
        ctx = ItemContext(lease=lease, spec=spec, engine=owner.engine, worker=owner.worker)
        owner.heartbeat.add(ctx)
        with self._lock:
            self._held[message_id] = ctx
        self.chained += 1

    def pop(self, message_id: str) -> ItemContext | None:
        with self._lock:
            return self._held.pop(message_id, None)

    def take(self, message: dramatiq.Message) -> ItemContext | None:
        """The lease held for ``message``, if one is; one held for another message of the same id
        (not the item and token the message names) is released."""
        ctx = self.pop(message.message_id)
        if ctx is None:
            return None
        if list(message.args) != [ctx.item_id, ctx.lease.token - 1]:  # not the message it was claimed for
            release(self.owner, ctx, "claimed for another message")
            return None
        return ctx

    def release_all(self, reason: str) -> None:
        """Give back every held lease (the worker is shutting down)."""
        with self._lock:
            waiting = list(self._held.values())
            self._held.clear()
        for ctx in waiting:
            release(self.owner, ctx, reason)
