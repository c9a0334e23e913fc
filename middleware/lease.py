"""The Dramatiq middleware of the lease protocol: its hooks wire validation, claims, finishes and top-ups.

- ``before_process_message``: validate the message against its lane's schema
  (``middleware.validation``), then claim the item(s) (``middleware.claiming``). A message that is
  malformed, for another lane, for an unknown item or with a stale token is rejected with a logged
  reason and an event, and never runs (``SkipMessage``).
- the actor runs with an ``ItemContext`` (``middleware.context.current()``), its lease renewed by
  the process's heartbeat thread.
- ``after_process_message``: finish the item through a fenced session (``middleware.finishing``):
  ``succeeded``, ``failed`` (or retried with backoff while attempts remain), ``cancelled``/``paused``
  for a cooperative stop. A lost lease writes nothing; a stale commit is refused by the fence. Then
  the lane is topped up (``middleware.top_up``).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware
from sqlalchemy import Engine

from store import items as store_items
from store.lanes import LaneSpec

from . import failpoints
from .claiming import Claims
from .context import STOP_SHUTDOWN, ItemContext, current_batch, peek_current, set_batch, set_current
from .dramatiq_compat import disarm_time_limit, served_queues
from .finishing import Finisher, Throws, finish_uninterrupted, release
from .heartbeat import Heartbeat, heartbeat_interval_for
from .locks import LockMiddleware
from .preclaims import Preclaims
from .presence import Presence
from .top_up import TopUp
from .validation import Rejections, is_lane_message, lane_of, throws_of

log = logging.getLogger("photojobs.lease")


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class LeaseMiddleware(Middleware):
    # Expected outcomes (a bad photo, a cooperative stop) are logged briefly, not as tracebacks.
    actor_options = {"throws"}

    def __init__(
        self,
        specs: dict[str, LaneSpec],
        engine_factory: Any,
        *,
        heartbeat_interval: float | None = None,
        publisher_factory: Any | None = None,
        locks: LockMiddleware | None = None,
        chain_claims: bool = True,
    ) -> None:
        """``heartbeat_interval``: ``PHOTOJOBS_HEARTBEAT_INTERVAL`` if set; None derives it from the
        shortest lease TTL of the lanes this worker serves (``heartbeat_interval_for``).
        ``locks``: the broker's ``LockMiddleware``, whose lock request each claim carries out in its
        own transaction (without one, each lane's declared lock mode is used).
        ``chain_claims``: a successful finish also claims the next message waiting in this worker
        process's work queue, in the same write transaction (``middleware.finishing``), where the
        store allows it (``store.items.can_chain_claims``: SQLite); off, every message is claimed in
        a transaction of its own."""
        self.locks = locks
        self.specs = specs
        self.by_actor = {a: s for s in specs.values() for a in (s.actor, s.interactive_actor)}
        self.engine_factory = engine_factory
        self.heartbeat_interval = heartbeat_interval
        self._engine: Engine | None = None
        self._heartbeat: Heartbeat | None = None
        self._boot_lock = threading.RLock()
        self.worker = worker_identity()
        self.presence = Presence(self)  # the worker registry entry (store.workers)
        self.rejections = Rejections(self)
        self.preclaims = Preclaims(self, enabled=chain_claims)
        self.claims = Claims(self, self.rejections, self.preclaims)
        self.finisher = Finisher(self, self.preclaims)
        self.top_up = TopUp(specs, lambda: self.engine, publisher_factory)

    # -- process lifetime ---------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            with self._boot_lock:
                if self._engine is None:
                    self._engine = self.engine_factory()
        return self._engine

    @property
    def heartbeat(self) -> Heartbeat:
        if self._heartbeat is None:
            with self._boot_lock:
                if self._heartbeat is None:
                    # All lanes until the worker boots and says which queues it serves.
                    interval = heartbeat_interval_for(self.specs.values(), self.heartbeat_interval)
                    hb = Heartbeat(self.engine, interval, on_beat=self.presence.beat)
                    hb.start()
                    self._heartbeat = hb
        return self._heartbeat

    @property
    def chained(self) -> int:
        """Claims made in a finishing transaction (tests, benchmarks)."""
        return self.preclaims.chained

    @property
    def rejected(self) -> int:
        """Messages rejected by this process."""
        return self.rejections.count

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        self.worker = worker_identity()  # one identity per worker process
        if hasattr(broker, "on_rejected"):
            broker.on_rejected = self.rejections.record
        _ = self.heartbeat

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Beat often enough for the shortest lease TTL among the lanes this worker consumes, and
        register the worker. Before the boot, not after: Dramatiq starts the worker threads and
        consumers between the two hooks, so an item could be claimed by a worker that the registry
        does not list yet."""
        queues = served_queues(worker)
        served = [s for s in self.specs.values() if not queues or set(s.queues) & queues] or list(
            self.specs.values()
        )
        self.heartbeat.interval = heartbeat_interval_for(served, self.heartbeat_interval)
        log.debug("heartbeat every %.2f s for lanes %s", self.heartbeat.interval, [s.name for s in served])
        self.presence.boot((s.name for s in served), threads=getattr(worker, "worker_threads", None))
        self.preclaims.worker = worker  # its work queue: the messages a finish may claim
        self.preclaims.enabled = self.preclaims.enabled and store_items.can_chain_claims(self.engine)

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        failpoints.hit("worker.boot")  # tests: a worker process that dies while booting

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.preclaims.enabled = False
        if self._heartbeat is not None:
            self._heartbeat.stop_all(STOP_SHUTDOWN, "worker shutting down")
        self.preclaims.release_all("worker shutting down before the item started")
        self.presence.stop()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    # -- messages -----------------------------------------------------------------
    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        self.rejections.after_nack(broker, message)

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        if not is_lane_message(message):
            return  # not a lane message; leave it to its actor
        spec, reason = lane_of(self.by_actor, message)
        if reason:
            self.rejections.reject(message, reason)
        if spec is None:
            raise RuntimeError("internal error: expected spec is not None")
        self.claims.claim(spec, message)

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        batch = current_batch()
        if batch is not None and self.by_actor.get(message.actor_name) is batch[0].spec:
            disarm_time_limit(broker)  # the finish is not the actor's work: no time limit applies to it
            set_batch(None)
            set_current(None)
            for ctx in batch:
                self.heartbeat.remove(ctx.item_id)
            throws = throws_of(broker, message)
            finish_uninterrupted(lambda: self.finisher.finish_batch(batch, exception, throws=throws))
            self.top_up(broker, batch[0])
            return
        ctx = peek_current()
        if ctx is None or self.by_actor.get(message.actor_name) is not ctx.spec:
            return
        disarm_time_limit(broker)
        set_current(None)
        self.heartbeat.remove(ctx.item_id)
        throws = throws_of(broker, message)
        one = ctx
        finish_uninterrupted(lambda: self.finisher.finish(one, one.result, exception, throws=throws))
        self.top_up(broker, ctx)

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        disarm_time_limit(broker)  # the releases below must not be interrupted either
        batch = current_batch()
        if batch is not None and self.by_actor.get(message.actor_name) is batch[0].spec:
            set_batch(None)
            for ctx in batch:  # claimed, then skipped by a middleware after this one: none started
                release(self, ctx, "message skipped before the item started")
        ctx = peek_current()
        if ctx is not None and self.by_actor.get(message.actor_name) is ctx.spec:
            set_current(None)
            self.heartbeat.remove(ctx.item_id)
        waiting = self.preclaims.pop(message.message_id)  # skipped before this middleware saw it
        if waiting is not None:
            release(self, waiting, "message skipped before the item started")

    # -- for tests and tools: the finishes without the hooks ------------------------------------
    def finish(
        self, ctx: ItemContext, result: Any, exception: BaseException | None, *, throws: Throws = ()
    ) -> None:
        self.finisher.finish(ctx, result, exception, throws=throws)

    def finish_batch(
        self, batch: list[ItemContext], exception: BaseException | None, *, throws: Throws = ()
    ) -> None:
        self.finisher.finish_batch(batch, exception, throws=throws)
