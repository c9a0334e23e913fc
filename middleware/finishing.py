"""Finishing items through their fences: one item or a batch message's, uninterrupted, and releases."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from dramatiq.middleware.threading import Interrupt
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store import items as store_items
from store.errors import StaleLease, bounded_trace, error_text
from store.fencing import fenced, fenced_batch
from store.items import lane_lock_request
from store.lanes import LaneSpec
from store.photo_locks import LockRequest

from . import failpoints
from .batch import EXPECTED_RACES
from .context import STOP_LOST, STOP_SHUTDOWN, ItemContext, Stopped
from .heartbeat import Heartbeat
from .locks import LockMiddleware

if TYPE_CHECKING:
    from .preclaims import Preclaims

log = logging.getLogger("photojobs.lease")
T = TypeVar("T")
Throws = type[BaseException] | tuple[type[BaseException], ...]
Plan = tuple[str, Callable[[Session], Any]]  # (what, write(session)) for a fenced transaction

FINISH_TRIES = 3  # a finish interrupted by a BaseException is run again (at most this many runs)


class Owner(Protocol):
    """What claims and finishes read from the lease middleware (identity and engine change at boot)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def heartbeat(self) -> Heartbeat: ...

    worker: str
    locks: LockMiddleware | None
    by_actor: dict[str, LaneSpec]


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


def fenced_write(owner: Owner, ctx: ItemContext, what: str, write: Callable[[Session], T]) -> T:
    """``write(session)`` committed through the item's fence; its value, once committed."""
    lease = ctx.lease
    with fenced(owner.engine, lease.item_id, lease.token, worker=owner.worker, what=what) as s:
        done = write(s)
        # tests: a worker frozen (``:stop``) inside its finish, the job's row share-locked and not
        # committed: the store ends the idle transaction within the lease TTL (``store.engine``)
        failpoints.hit("finish.before_commit")
        return done


def release(owner: Owner, ctx: ItemContext, reason: str) -> None:
    """A claimed item that never started: back to ready without using an attempt."""
    owner.heartbeat.remove(ctx.item_id)
    try:
        fenced_write(owner, ctx, "stop", lambda s: store_items.stop(s, ctx.lease, owner.worker, reason))
    except StaleLease:
        pass  # revoked meanwhile: nothing to give back
    except Exception:  # noqa: BLE001 - the lease expires and the sweeper revokes it
        log.warning("could not release item %s; its lease will expire", ctx.item_id, exc_info=True)


def lock_request(owner: Owner, spec: LaneSpec, item_id: int) -> LockRequest | None:
    """The photo locks a claim of the item takes: the lock middleware's request, else the lane's."""
    return owner.locks.request_for(spec, item_id) if owner.locks is not None else lane_lock_request(spec)


def _payload(result: Any) -> dict[str, Any] | None:
    """An actor's return value as the item's stored result."""
    return result if isinstance(result, dict) or result is None else {"value": result}


class Finisher:
    """Commits items' outcomes: ``finish`` (one item; a success may chain the next claim) and
    ``finish_batch`` (a batch message's items in one transaction)."""

    def __init__(self, owner: Owner, preclaims: Preclaims) -> None:
        self.owner = owner
        self.preclaims = preclaims

    def finish(
        self, ctx: ItemContext, result: Any, exception: BaseException | None, *, throws: Throws = ()
    ) -> None:
        """Commit the item's outcome through the fence; an exception the actor declares in its
        ``throws`` option (a bad photo) fails the item at once, any other is retried."""
        if exception is None:
            try:
                self._succeed(ctx, result)  # even after a lost lease: the fence decides
            except Exception as exc:  # noqa: BLE001 - judged as any finish's failure
                self._failed(ctx, exc)
            return
        plan = self._plan(ctx, result, exception, throws)
        if plan is not None:
            self._alone(ctx, *plan)

    def _plan(
        self, ctx: ItemContext, result: Any, exception: BaseException | None, throws: Throws
    ) -> Plan | None:
        """What finishing the item writes; None when nothing may be written (its lease was lost)."""
        lease, spec, who = ctx.lease, ctx.spec, self.owner.worker
        if exception is None:
            payload = _payload(result)
            return "succeed", lambda s: store_items.succeed(s, lease, payload, who, ctx.at_finish)
        if isinstance(exception, Stopped):
            if exception.kind == STOP_LOST:
                log.warning("item %s token %s: lease lost; nothing written", lease.item_id, lease.token)
                return None
            delay = getattr(exception, "delay", None)  # a Deferred item: pending again, later
            return "stop", lambda s: store_items.stop(s, lease, who, str(exception), delay=delay)
        race = isinstance(exception, EXPECTED_RACES)  # declared to Dramatiq (no traceback), retried
        permanent = isinstance(exception, throws) and not race
        error = str(exception) if permanent else f"{type(exception).__name__}: {exception}"
        retry = not permanent
        unexpected = not (permanent or race)
        trace = bounded_trace(exception) if unexpected else None  # an unexpected exception's traceback
        return "fail", lambda s: store_items.fail(s, spec, lease, error, who, retry=retry, trace=trace)

    def _alone(self, ctx: ItemContext, what: str, write: Callable[[Session], Any]) -> None:
        """One item's finish in a fenced transaction of its own."""
        try:
            fenced_write(self.owner, ctx, what, write)
        except Exception as exc:  # noqa: BLE001 - judged below
            self._failed(ctx, exc)

    def _failed(self, ctx: ItemContext, exc: Exception) -> None:
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
        self, batch: list[ItemContext], exception: BaseException | None, *, throws: Throws = ()
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
        plain: list[tuple[store_items.Lease, dict[str, Any] | None]] = []  # succeed_many's
        for ctx in sorted(batch, key=lambda c: (c.lease.job_id, c.item_id)):
            if ctx.ran and ctx.error is None and store_items.plain_success(ctx.lease, ctx.at_finish):
                plain.append((ctx.lease, _payload(ctx.result)))
                plan = self._plan(ctx, ctx.result, None, throws)  # alone, should the batch fail
            elif ctx.ran:
                plan = self._plan(ctx, ctx.result, ctx.error, throws)
            elif isinstance(ctx.error, Stopped):  # asked to stop before its turn
                plan = self._plan(ctx, None, ctx.error, throws)
            elif exception is not None and not isinstance(exception, Interrupt):
                plan = self._plan(ctx, None, exception, throws)
            else:
                unrun = Stopped(STOP_SHUTDOWN, "the message ended before the item's turn")
                plan = self._plan(ctx, None, unrun, throws)
            if plan is not None:
                plans.append((ctx, *plan))
        if not plans:
            return
        try:
            with fenced_batch(self.owner.engine, [ctx.item_id for ctx, _, _ in plans]) as s:
                done = {lease.item_id for lease, _ in plain}
                store_items.lock_batch_finish(s, [ctx.lease for ctx, _, _ in plans], done)
                # The plain successes in one compare-and-set (per distinct result), the rest each
                # through its own writes; every item's fence is checked either way.
                store_items.succeed_many(s, plain, self.owner.worker)
                for ctx, _, write in plans:
                    if ctx.item_id not in done:
                        write(s)
                failpoints.hit("finish.before_commit")  # tests: frozen inside a batch's finish
        except Exception as exc:  # noqa: BLE001 - each item on its own says what went wrong
            log.debug("batch finish failed (%s); finishing its items one by one", error_text(exc))
            for ctx, what, write in plans:
                self._alone(ctx, what, write)

    def _succeed(self, ctx: ItemContext, result: Any) -> None:
        """The fenced success; with the claim of the next message waiting in the work queue
        (``Preclaims.next_message``) in the same transaction."""
        owner, preclaims = self.owner, self.preclaims
        payload = _payload(result)
        nxt = preclaims.next_message()

        def finish(s: Session) -> None:
            store_items.succeed(s, ctx.lease, payload, owner.worker, ctx.at_finish)

        if nxt is None:
            fenced_write(owner, ctx, "succeed", finish)
            return
        entry, spec = nxt
        msg = entry.message
        item_id, token = msg.args
        request = lock_request(owner, spec, item_id)

        def finish_and_claim(s: Session) -> store_items.Lease | None:
            finish(s)
            return store_items.claim_chained(s, spec, item_id, token, owner.worker, request)

        try:
            chained = fenced_write(owner, ctx, "succeed", finish_and_claim)
            if chained is not None:
                preclaims.hold(msg.message_id, spec, chained)
        finally:
            preclaims.put_back(entry)
