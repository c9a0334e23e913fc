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
from dramatiq.middleware import Middleware, SkipMessage, TimeLimit
from dramatiq.middleware.threading import Interrupt
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store import items as store_items
from store.dispatch import take_for_dispatch
from store.errors import DETERMINISTIC, UNAVAILABLE, StaleLease, classify_store_error, error_text
from store.events import emit
from store.fencing import fenced, fenced_batch
from store.items import lane_lock_request
from store.lanes import ACTOR_PREFIX, LaneSpec, message_pairs
from store.photo_locks import LockRequest

from . import failpoints
from .context import (
    STOP_LOST,
    STOP_SHUTDOWN,
    ItemContext,
    Stopped,
    current_batch,
    peek_current,
    set_batch,
    set_current,
)
from .heartbeat import Heartbeat, heartbeat_interval_for
from .locks import LockMiddleware
from .presence import Presence

log = logging.getLogger("photojobs.lease")
T = TypeVar("T")


def _throws(broker: dramatiq.Broker, message: dramatiq.Message) -> tuple[type[BaseException], ...]:
    """The exceptions the message's actor declares (its ``throws`` option): they fail an item at once."""
    throws = broker.get_actor(message.actor_name).options.get("throws") or ()
    return throws if isinstance(throws, tuple) else (throws,)


def _payload(result: Any) -> dict[str, Any] | None:
    """An actor's return value as the item's stored result."""
    return result if isinstance(result, dict) or result is None else {"value": result}


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def disarm_time_limit(broker: dramatiq.Broker) -> None:
    """Stop Dramatiq's ``TimeLimit`` clock for this worker thread before the item is finished.

    Dramatiq runs ``after_*`` hooks in reverse order, so ``TimeLimit`` (the broker's first
    middleware) would disarm only after this middleware had finished the items: a limit that ran
    out during the finish raised ``TimeLimitExceeded`` inside the finishing transaction, leaving
    the items ``running`` until the sweeper revoked them. The finish is not the actor's work: the
    time limit does not apply to it."""
    for m in broker.middleware:
        if isinstance(m, TimeLimit):
            m.manager.remove_timeout(threading.get_ident())


FINISH_TRIES = 3  # a finish interrupted by a BaseException is run again (at most this many runs)


def finish_uninterrupted(finish: Callable[[], None]) -> None:
    """Run ``finish`` to its end even when a ``BaseException`` lands in it — the time limit's
    ``TimeLimitExceeded`` raised by its timer thread just before ``disarm_time_limit`` (the timer
    decides under its lock but raises after it), a shutdown notification — then re-raise the first
    one. A finish is safe to run again: each item's writes go through its fence, so a run that had
    committed before the interrupt makes the next one a refused (logged) stale commit."""
    caught: BaseException | None = None
    for _ in range(FINISH_TRIES):
        try:
            finish()
        except BaseException as exc:  # noqa: BLE001 - finish first, re-raised below
            if caught is None:
                caught = exc
            log.warning("the finish was interrupted by %s; finishing again", type(exc).__name__)
            continue
        break
    if caught is not None:
        raise caught


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
        self._record_reject(message, reason)
        raise SkipMessage(reason)

    def _record_reject(self, message: dramatiq.Message, reason: str) -> None:
        log.warning("rejected message %s on %s: %s", message.message_id, message.queue_name, reason)
        self.record_rejection(message.queue_name, message.actor_name, reason, repr(message.args)[:200])

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
        if spec is None:
            raise RuntimeError('internal error: expected spec is not None')
        if len(message.args) > 2:
            self._claim_batch(spec, message)
            return
        item_id, token = message.args
        ctx = self._take_preclaimed(message)
        if ctx is not None:  # claimed by the finish of this process's last item (``_succeed``)
            set_current(ctx)
            return
        locks = self._lock_request(spec, item_id)
        try:
            outcome = store_items.claim(self.engine, spec, item_id, token, self.worker, locks)
        except Exception as exc:  # noqa: BLE001 - judged below: unavailable, transient or deterministic
            raise SkipMessage(self._claim_raised(spec, item_id, token, exc)) from exc
        ctx = self._claimed(message, spec, item_id, outcome)
        if ctx is None:
            raise SkipMessage(outcome.reason)
        set_current(ctx)

    def _claimed(
        self, message: dramatiq.Message, spec: LaneSpec, item_id: int, outcome: store_items.ClaimOutcome
    ) -> ItemContext | None:
        """What a claim's outcome means: the item's context (its lease renewed from now on), or None
        with the reason logged — a deferral or an item its job stopped quietly, anything else as a
        rejection (``message_rejected``)."""
        if self.locks is not None:
            if outcome.lease is not None:
                self.locks.claimed(item_id)
            elif outcome.locked:
                self.locks.conflicted(item_id)
        if outcome.lease is None:
            if outcome.deferred or outcome.reason.endswith(_STOPPED):
                # A deferral, or the doorbell of an item its job paused or cancelled: a normal skip.
                log.debug("item %s skipped: %s", item_id, outcome.reason)
            else:
                self._record_reject(message, outcome.reason)
            return None
        ctx = ItemContext(lease=outcome.lease, spec=spec, engine=self.engine, worker=self.worker)
        self.heartbeat.add(ctx)
        return ctx

    def _claim_batch(self, spec: LaneSpec, message: dramatiq.Message) -> None:
        """A batch message: its items claimed in one transaction (``store.items.claim_batch``); the
        actor then runs the claimed ones in turn (``middleware.batch``). When that transaction
        fails, each item claims on its own, so each failure is judged like a single message's."""
        pairs = [(int(i), int(t)) for i, t in message_pairs(message.args)]
        requests = {item_id: self._lock_request(spec, item_id) for item_id, _ in pairs}
        try:
            outcomes = store_items.claim_batch(self.engine, spec, pairs, self.worker, requests)
        except Exception as exc:  # noqa: BLE001 - store unreachable: skip; otherwise one by one
            if classify_store_error(exc) == UNAVAILABLE:
                raise SkipMessage(self._claim_raised(spec, pairs[0][0], pairs[0][1], exc)) from exc
            log.info("batch claim failed (%s); claiming its items one by one", error_text(exc))
            outcomes = []
            for item_id, token in pairs:
                try:
                    outcomes.append(
                        store_items.claim(self.engine, spec, item_id, token, self.worker, requests[item_id])
                    )
                except Exception as one:  # noqa: BLE001 - recorded on the item, like a single message's
                    reason = self._claim_raised(spec, item_id, token, one)
                    outcomes.append(store_items.ClaimOutcome(None, reason, deferred=True))
        batch = [
            ctx
            for (item_id, _), outcome in zip(pairs, outcomes, strict=True)
            if (ctx := self._claimed(message, spec, item_id, outcome)) is not None
        ]
        if not batch:
            raise SkipMessage("no item of the batch message is claimable")
        set_batch(batch)

    def _claim_raised(self, spec: LaneSpec, item_id: int, token: int, exc: Exception) -> str:
        """A claim raised. Store unreachable: the item stays queued and the sweeper re-publishes it.
        Otherwise the failure is recorded on the item: a deterministic error (or one that repeats)
        counts as an attempt and ends the item ``failed`` after the lane's attempt limit, instead
        of the message coming back every few seconds forever. Returns why the message is skipped."""
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
                return f"claim failed: {error}"
        log.warning("could not claim item %s (%s); leaving it to the sweeper", item_id, error)
        return f"store unavailable: {error}"

    def after_process_message(
        self,
        broker: dramatiq.Broker,
        message: dramatiq.Message,
        *,
        result: Any = None,
        exception: BaseException | None = None,
    ) -> None:
        batch = current_batch()
        if batch is not None and message.actor_name == batch[0].spec.actor:
            disarm_time_limit(broker)
            set_batch(None)
            set_current(None)
            for ctx in batch:
                self.heartbeat.remove(ctx.item_id)
            throws = _throws(broker, message)
            finish_uninterrupted(lambda: self.finish_batch(batch, exception, throws=throws))
            self.top_up(broker, batch[0])
            return
        ctx = peek_current()
        if ctx is None or message.actor_name != ctx.spec.actor:
            return
        disarm_time_limit(broker)
        set_current(None)
        self.heartbeat.remove(ctx.item_id)
        throws = _throws(broker, message)
        one = ctx
        finish_uninterrupted(lambda: self.finish(one, one.result, exception, throws=throws))
        self.top_up(broker, ctx)

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        disarm_time_limit(broker)  # the releases below must not be interrupted either
        batch = current_batch()
        if batch is not None and message.actor_name == batch[0].spec.actor:
            set_batch(None)
            for ctx in batch:  # claimed, then skipped by a middleware after this one: none started
                self._release(ctx, "message skipped before the item started")
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
        if spec is None or reason or len(msg.args) != 2 or msg.message_id in self._preclaimed:
            self._put_back(entry)
            return None
        return entry, spec

    def _put_back(self, entry: Any) -> None:
        if self._worker is None:
            raise RuntimeError('internal error: expected self._worker is not None')
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
        if exception is None:
            try:
                self._succeed(ctx, result)  # even after a lost lease: the fence decides
            except Exception as exc:  # noqa: BLE001 - judged as any finish's failure
                self._finish_failed(ctx, exc)
            return
        plan = self._finish_plan(ctx, result, exception, throws)
        if plan is not None:
            self._finish_alone(ctx, *plan)

    def _finish_plan(
        self,
        ctx: ItemContext,
        result: Any,
        exception: BaseException | None,
        throws: type[BaseException] | tuple[type[BaseException], ...],
    ) -> tuple[str, Callable[[Session], Any]] | None:
        """What finishing the item writes, as (what, write(session)) for a fenced transaction; None
        when nothing may be written (its lease was lost)."""
        lease, spec, who = ctx.lease, ctx.spec, self.worker
        if exception is None:
            payload = _payload(result)
            return "succeed", lambda s: store_items.succeed(s, lease, payload, who, ctx.at_finish)
        if isinstance(exception, Stopped):
            if exception.kind == STOP_LOST:
                log.warning("item %s token %s: lease lost; nothing written", lease.item_id, lease.token)
                return None
            return "stop", lambda s: store_items.stop(s, lease, who, str(exception))
        permanent = isinstance(exception, throws)
        error = str(exception) if permanent else f"{type(exception).__name__}: {exception}"
        retry = not permanent
        return "fail", lambda s: store_items.fail(s, spec, lease, error, who, retry=retry)

    def _finish_alone(self, ctx: ItemContext, what: str, write: Callable[[Session], Any]) -> None:
        """One item's finish in a fenced transaction of its own."""
        try:
            self._fenced(ctx, what, write)
        except Exception as exc:  # noqa: BLE001 - judged below
            self._finish_failed(ctx, exc)

    def _finish_failed(self, ctx: ItemContext, exc: Exception) -> None:
        if isinstance(exc, StaleLease):
            log.warning("commit refused, lease is stale: %s", exc)
            return
        # The store is down: the lease expires and the sweeper retries.
        log.error(
            "could not finish item %s; its lease will expire and it will be retried",
            ctx.lease.item_id,
            exc_info=exc,
        )

    def finish_batch(
        self,
        batch: list[ItemContext],
        exception: BaseException | None,
        *,
        throws: type[BaseException] | tuple[type[BaseException], ...] = (),
    ) -> None:
        """Commit the outcomes of a batch message's items in one transaction, each through its own
        fence (``store.fencing.fenced_batch``), in (job, item) order. An item whose body never
        started (``ctx.ran`` False) is stopped as its job asks now — cancelled, paused or released —
        and gives its attempt back, whatever ended the message (an interrupt between items, a stop
        request before its turn); only an error that is not an interrupt (a bug in the actor's
        wrapper, before any item ran) is charged to them. If that transaction fails — one lease
        stale, the store — each item is finished in a transaction of its own, which records what
        went wrong for that item."""
        plans: list[tuple[ItemContext, str, Callable[[Session], Any]]] = []
        for ctx in sorted(batch, key=lambda c: (c.lease.job_id, c.item_id)):
            if ctx.ran:
                plan = self._finish_plan(ctx, ctx.result, ctx.error, throws)
            elif isinstance(ctx.error, Stopped):  # asked to stop before its turn
                plan = self._finish_plan(ctx, None, ctx.error, throws)
            elif exception is not None and not isinstance(exception, Interrupt):
                plan = self._finish_plan(ctx, None, exception, throws)
            else:
                unrun = Stopped(STOP_SHUTDOWN, "the message ended before the item's turn")
                plan = self._finish_plan(ctx, None, unrun, throws)
            if plan is not None:
                plans.append((ctx, *plan))
        if not plans:
            return
        try:
            with fenced_batch(self.engine, [ctx.item_id for ctx, _, _ in plans]) as s:
                store_items.lock_batch_finish(s, [ctx.lease for ctx, _, _ in plans])
                for _, _, write in plans:
                    write(s)
        except Exception as exc:  # noqa: BLE001 - each item on its own says what went wrong
            log.debug("batch finish failed (%s); finishing its items one by one", error_text(exc))
            for ctx, what, write in plans:
                self._finish_alone(ctx, what, write)

    def _succeed(self, ctx: ItemContext, result: Any) -> None:
        """The fenced success; with the claim of the next message waiting in the work queue
        (``_next_message``) in the same transaction."""
        payload = _payload(result)
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
