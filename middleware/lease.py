"""The Dramatiq middleware of the lease protocol: validate, claim, heartbeat, finish through the fence.

- ``before_process_message``: validate the message against its lane's schema, then claim the item
  by compare-and-set. A message that is malformed, for another lane, for an unknown item or with a
  stale token is rejected with a logged reason and an event, and never runs (``SkipMessage``).
- the actor runs with an ``ItemContext`` (``middleware.context.current()``), its lease renewed by
  the process's heartbeat thread.
- ``after_process_message``: finish the item through a fenced session: ``succeeded``, ``failed``
  (or retried with backoff while attempts remain), ``cancelled``/``paused`` for a cooperative stop.
  A lost lease writes nothing; a stale commit is refused by the fence. Then the lane is topped up.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import dramatiq
from dramatiq.middleware import Middleware, SkipMessage
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store import items as store_items
from store.dispatch import take_for_dispatch
from store.errors import DETERMINISTIC, UNAVAILABLE, StaleLease, classify_store_error, error_text
from store.events import emit
from store.fencing import fenced
from store.items import lane_lock_request
from store.lanes import ACTOR_PREFIX, LaneSpec
from store.photo_locks import LockRequest

from . import failpoints
from .context import STOP_LOST, STOP_SHUTDOWN, ItemContext, Stopped, peek_current, set_current
from .heartbeat import Heartbeat, heartbeat_interval_for
from .locks import LockMiddleware
from .presence import Presence

log = logging.getLogger("photojobs.lease")
T = TypeVar("T")


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


# Claim outcomes (store.items.claim) for an item its job paused or cancelled.
_STOPPED = (" is paused, not claimable", " is cancelled, not claimable")


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
        process's work queue, in the same write transaction (``_succeed``), where the store allows
        it (``store.items.can_chain_claims``: SQLite); off, every message is claimed in a
        transaction of its own."""
        self.locks = locks
        self.specs = specs
        self.by_actor = {s.actor: s for s in specs.values()}
        self.engine_factory = engine_factory
        self.heartbeat_interval = heartbeat_interval
        self.publisher_factory = publisher_factory
        self._engine: Engine | None = None
        self._publisher: Any = None
        self._topup_skip: dict[str, int] = {}  # lane -> top-ups to skip before asking Redis again
        self._heartbeat: Heartbeat | None = None
        self._boot_lock = threading.RLock()
        self.worker = worker_identity()
        self.rejected = 0
        self.presence = Presence(self)  # the worker registry entry (store.workers)
        self.chain_claims = chain_claims
        self._worker: dramatiq.Worker | None = None
        # Leases claimed by a finish for a message still in the work queue: message id -> context.
        self._preclaimed: dict[str, ItemContext] = {}
        self._preclaimed_lock = threading.Lock()
        self.chained = 0  # claims made in a finishing transaction (tests, benchmarks)

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

    def after_process_boot(self, broker: dramatiq.Broker) -> None:
        self.worker = worker_identity()  # one identity per worker process
        if hasattr(broker, "on_rejected"):
            broker.on_rejected = self.record_rejection
        _ = self.heartbeat

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        """Beat often enough for the shortest lease TTL among the lanes this worker consumes, and
        register the worker. Before the boot, not after: Dramatiq starts the worker threads and
        consumers between the two hooks, so an item could be claimed by a worker that the registry
        does not list yet."""
        queues = getattr(worker, "consumer_whitelist", None)
        served = [s for s in self.specs.values() if not queues or s.queue in queues] or list(
            self.specs.values()
        )
        self.heartbeat.interval = heartbeat_interval_for(served, self.heartbeat_interval)
        log.debug("heartbeat every %.2f s for lanes %s", self.heartbeat.interval, [s.name for s in served])
        self.presence.boot(s.name for s in served)
        self._worker = worker  # its work queue: the messages a finish may claim (``_succeed``)
        self.chain_claims = self.chain_claims and store_items.can_chain_claims(self.engine)

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        failpoints.hit("worker.boot")  # tests: a worker process that dies while booting

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.chain_claims = False
        if self._heartbeat is not None:
            self._heartbeat.stop_all(STOP_SHUTDOWN, "worker shutting down")
        with self._preclaimed_lock:
            waiting = list(self._preclaimed.values())
            self._preclaimed.clear()
        for ctx in waiting:
            self._release(ctx, "worker shutting down before the item started")
        self.presence.stop()

    def after_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        if self._heartbeat is not None:
            self._heartbeat.stop()

    # -- messages -----------------------------------------------------------------
    def record_rejection(self, queue: str, actor: str | None, reason: str, args: str) -> None:
        """Count a rejected message: a ``message_rejected`` event (no item changes)."""
        self.rejected += 1
        try:
            with Session(self.engine) as s, s.begin():
                emit(
                    s,
                    "message_rejected",
                    worker=self.worker,
                    detail={"reason": reason, "queue": queue, "actor": actor, "args": args},
                )
        except Exception:  # noqa: BLE001 - recording the rejection must not fail the worker
            log.exception("could not record the rejected message")

    def _reject(self, message: dramatiq.Message, reason: str) -> None:
        log.warning("rejected message %s on %s: %s", message.message_id, message.queue_name, reason)
        self.record_rejection(message.queue_name, message.actor_name, reason, repr(message.args)[:200])
        raise SkipMessage(reason)

    def after_nack(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        if message.actor_name not in broker.actors:  # Dramatiq dead-letters messages for unknown actors
            reason = f"unknown actor {message.actor_name!r}"
            log.warning("rejected message %s on %s: %s", message.message_id, message.queue_name, reason)
            self.record_rejection(message.queue_name, message.actor_name, reason, repr(message.args)[:200])

    def _lane_of(self, message: dramatiq.Message) -> tuple[LaneSpec | None, str]:
        """The lane of a lane actor's message, and what is wrong with the message ("" if nothing)."""
        spec = self.by_actor.get(message.actor_name)
        if spec is None:
            return None, f"unknown lane actor {message.actor_name!r}"
        if message.queue_name != spec.queue:
            return spec, f"{spec.name} message arrived on queue {message.queue_name!r}"
        return spec, spec.message_args_valid(list(message.args), message.kwargs) or ""

    def _lock_request(self, spec: LaneSpec, item_id: int) -> LockRequest | None:
        """The photo locks a claim of the item takes: the lock middleware's request, else the lane's."""
        return self.locks.request_for(spec, item_id) if self.locks is not None else lane_lock_request(spec)

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        if not message.actor_name.startswith(ACTOR_PREFIX):
            return  # not a lane message; leave it to its actor
        spec, reason = self._lane_of(message)
        if reason:
            self._reject(message, reason)
        assert spec is not None
        item_id, token = message.args
        ctx = self._take_preclaimed(message)
        if ctx is not None:  # claimed by the finish of this process's last item (``_succeed``)
            set_current(ctx)
            return
        locks = self._lock_request(spec, item_id)
        try:
            outcome = store_items.claim(self.engine, spec, item_id, token, self.worker, locks)
        except Exception as exc:  # noqa: BLE001 - judged below: unavailable, transient or deterministic
            self._claim_raised(spec, item_id, token, exc)
        if self.locks is not None:
            if outcome.lease is not None:
                self.locks.claimed(item_id)
            elif outcome.locked:
                self.locks.conflicted(item_id)
        if outcome.lease is None:
            if outcome.deferred or outcome.reason.endswith(_STOPPED):
                # A deferral, or the doorbell of an item its job paused or cancelled: a normal skip.
                log.debug("item %s skipped: %s", item_id, outcome.reason)
                raise SkipMessage(outcome.reason)
            self._reject(message, outcome.reason)
        ctx = ItemContext(lease=outcome.lease, spec=spec, engine=self.engine, worker=self.worker)
        set_current(ctx)
        self.heartbeat.add(ctx)

    def _claim_raised(self, spec: LaneSpec, item_id: int, token: int, exc: Exception) -> None:
        """A claim raised. Store unreachable: the item stays queued and the sweeper re-publishes it.
        Otherwise the failure is recorded on the item: a deterministic error (or one that repeats)
        counts as an attempt and ends the item ``failed`` after the lane's attempt limit, instead
        of the message coming back every few seconds forever."""
        kind = classify_store_error(exc)
        error = error_text(exc)
        if kind != UNAVAILABLE:
            try:
                state = store_items.claim_failed(
                    self.engine, spec, item_id, token, error, self.worker, counts=kind == DETERMINISTIC
                )
            except Exception as again:  # noqa: BLE001 - the store is not answering after all
                log.warning("could not record the failed claim of item %s: %s", item_id, error_text(again))
            else:
                log.warning("claim of item %s failed (%s, %s); item is now %s", item_id, kind, error, state)
                raise SkipMessage(f"claim failed: {error}") from exc
        log.warning("could not claim item %s (%s); leaving it to the sweeper", item_id, error)
        raise SkipMessage(f"store unavailable: {error}") from exc

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        ctx = peek_current()
        if ctx is None or message.actor_name != ctx.spec.actor:
            return
        set_current(None)
        self.heartbeat.remove(ctx.item_id)
        throws = broker.get_actor(message.actor_name).options.get("throws") or ()
        self.finish(ctx, ctx.result, exception, throws=throws)
        self.top_up(broker, ctx)

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        ctx = peek_current()
        if ctx is not None and message.actor_name == ctx.spec.actor:
            set_current(None)
            self.heartbeat.remove(ctx.item_id)
        waiting = self._pop_preclaimed(message.message_id)  # skipped before this middleware saw it
        if waiting is not None:
            self._release(waiting, "message skipped before the item started")

    # -- chained claims -----------------------------------------------------------
    def _pop_preclaimed(self, message_id: str) -> ItemContext | None:
        with self._preclaimed_lock:
            return self._preclaimed.pop(message_id, None)

    def _take_preclaimed(self, message: dramatiq.Message) -> ItemContext | None:
        ctx = self._pop_preclaimed(message.message_id)
        if ctx is None:
            return None
        if list(message.args) != [ctx.item_id, ctx.lease.token - 1]:  # not the message it was claimed for
            self._release(ctx, "claimed for another message")
            return None
        return ctx

    def _release(self, ctx: ItemContext, reason: str) -> None:
        """A chained claim whose item never started: back to ready without using an attempt."""
        self.heartbeat.remove(ctx.item_id)
        try:
            self._fenced(ctx, "stop", lambda s: store_items.stop(s, ctx.lease, self.worker, reason))
        except StaleLease:
            pass  # revoked meanwhile: nothing to give back
        except Exception:  # noqa: BLE001 - the lease expires and the sweeper revokes it
            log.warning("could not release item %s; its lease will expire", ctx.item_id, exc_info=True)

    def _next_message(self) -> tuple[Any, LaneSpec] | None:
        """The next message of this process's work queue, taken out while its claim is made
        (``_put_back`` returns it, in front again), when it is a valid lane message."""
        worker = self._worker
        if not self.chain_claims or worker is None:
            return None
        try:
            entry = worker.work_queue.get_nowait()
        except queue.Empty:
            return None
        msg = entry.message
        spec, reason = self._lane_of(msg)
        if spec is None or reason or msg.message_id in self._preclaimed:
            self._put_back(entry)
            return None
        return entry, spec

    def _put_back(self, entry: Any) -> None:
        assert self._worker is not None
        self._worker.work_queue.put(entry)  # its priority and queue time: at the front again
        self._worker.work_queue.task_done()  # the put counted a second task for one message

    # -- finishing ----------------------------------------------------------------
    def finish(
        self,
        ctx: ItemContext,
        result: Any,
        exception: BaseException | None,
        *,
        throws: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> None:
        """Commit the item's outcome through the fence; an exception the actor declares in its
        ``throws`` option (a bad photo) fails the item at once, any other is retried."""
        lease, spec = ctx.lease, ctx.spec
        try:
            if exception is None:
                self._succeed(ctx, result)  # even after a lost lease: the fence decides
                return
            if isinstance(exception, Stopped):
                if exception.kind == STOP_LOST:
                    log.warning("item %s token %s: lease lost; nothing written", lease.item_id, lease.token)
                    return
                self._fenced(ctx, "stop", lambda s: store_items.stop(s, lease, self.worker, str(exception)))
                return
            permanent = isinstance(exception, throws)
            error = str(exception) if permanent else f"{type(exception).__name__}: {exception}"
            retry, who = not permanent, self.worker
            self._fenced(ctx, "fail", lambda s: store_items.fail(s, spec, lease, error, who, retry=retry))
        except StaleLease as exc:
            log.warning("commit refused, lease is stale: %s", exc)
        except Exception:  # noqa: BLE001 - the store is down: the lease expires and the sweeper retries
            log.exception(
                "could not finish item %s; its lease will expire and it will be retried", lease.item_id
            )

    def _succeed(self, ctx: ItemContext, result: Any) -> None:
        """The fenced success; with the claim of the next message waiting in the work queue
        (``_next_message``) in the same transaction."""
        payload = result if isinstance(result, dict) or result is None else {"value": result}
        nxt = self._next_message()

        def finish(s: Session) -> None:
            store_items.succeed(s, ctx.lease, payload, self.worker, ctx.at_finish)

        if nxt is None:
            self._fenced(ctx, "succeed", finish)
            return
        entry, spec = nxt
        msg = entry.message
        item_id, token = msg.args
        request = self._lock_request(spec, item_id)

        def finish_and_claim(s: Session) -> store_items.Lease | None:
            finish(s)
            return store_items.claim_chained(s, spec, item_id, token, self.worker, request)

        try:
            chained = self._fenced(ctx, "succeed", finish_and_claim)
            if chained is not None:
                self._hold_preclaimed(msg.message_id, spec, chained)
        finally:
            self._put_back(entry)

    def _hold_preclaimed(self, message_id: str, spec: LaneSpec, lease: store_items.Lease) -> None:
        """A chained claim committed: its lease is renewed from now, and the message's
        ``before_process_message`` (in whichever thread takes it) runs with it."""
        if self.locks is not None:
            self.locks.claimed(lease.item_id)
        ctx = ItemContext(lease=lease, spec=spec, engine=self.engine, worker=self.worker)
        self.heartbeat.add(ctx)
        with self._preclaimed_lock:
            self._preclaimed[message_id] = ctx
        self.chained += 1

    def _fenced(self, ctx: ItemContext, what: str, write: Callable[[Session], T]) -> T:
        """``write(session)`` committed through the item's fence; its value, once committed."""
        lease = ctx.lease
        with fenced(self.engine, lease.item_id, lease.token, worker=self.worker, what=what) as s:
            return write(s)

    def top_up(self, broker: dramatiq.Broker, ctx: ItemContext) -> None:
        """Refill this lane (and the next one of the job) so workers don't wait for the sweeper."""
        if self.publisher_factory is None:
            return
        try:
            if self._publisher is None:
                self._publisher = self.publisher_factory(broker)
            lanes = [ctx.spec]
            job_lanes = ctx.lease.job_lanes
            if ctx.spec.name in job_lanes:
                nxt = job_lanes.index(ctx.spec.name) + 1
                if nxt < len(job_lanes) and job_lanes[nxt] in self.specs:
                    lanes.append(self.specs[job_lanes[nxt]])
            for spec in lanes:
                # A cheap look at Redis first: the dispatcher transaction is only worth it when the
                # lane's queue has room for a good batch (otherwise the sweeper keeps it topped up).
                # A queue found L long cannot fall to half the bound before L - bound/2 more items
                # are taken from it, this process's share of which (1 / fleet processes) it skips
                # asking again: one Redis round trip per batch instead of one per item.
                if self._topup_skip.get(spec.name, 0) > 0:
                    self._topup_skip[spec.name] -= 1
                    continue
                length, half = self._publisher.queue_length(spec.name), spec.effective_bound // 2
                if length > half:
                    self._topup_skip[spec.name] = (length - half) // max(1, spec.fleet_processes)
                    continue
                self._publisher.publish(take_for_dispatch(self.engine, spec))
        except Exception:  # noqa: BLE001 - the sweeper tops up too
            log.warning("top-up after item %s failed; the sweeper will dispatch", ctx.item_id, exc_info=True)
