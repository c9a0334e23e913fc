"""Claiming a lane message's items: one interface (``Claims.claim``), three strategies.

- ``ChainedClaim``: the lease a finish already claimed for this message (``middleware.preclaims``);
- ``BatchClaim``: a batch message's items in one transaction (``store.items.claim_batch``), one by
  one when that transaction fails;
- ``SingleClaim``: one item by compare-and-set (``store.items.claim``).

A strategy sets the running context (``set_current`` / ``set_batch``) or raises ``SkipMessage``.
"""

from __future__ import annotations

import logging
from typing import Protocol

import dramatiq
from dramatiq.middleware import SkipMessage

from store import items as store_items
from store.errors import DETERMINISTIC, UNAVAILABLE, classify_store_error, error_text
from store.lanes import LaneSpec, message_pairs
from store.leases import JOB_STOPPED

from .context import ItemContext, set_batch, set_current
from .finishing import Owner, lock_request
from .preclaims import Preclaims
from .validation import Rejections

log = logging.getLogger("photojobs.lease")

class ClaimStrategy(Protocol):
    def claim(self, spec: LaneSpec, message: dramatiq.Message) -> bool:
        """True once the message's context is set; False if this strategy is not for the message.
        Raises ``SkipMessage`` when the message must not run."""
        ...


class Outcomes:
    """What claims' outcomes and failures mean (shared by the single and batch claims)."""

    def __init__(self, owner: Owner, rejections: Rejections) -> None:
        self.owner = owner
        self.rejections = rejections

    def claimed(
        self, message: dramatiq.Message, spec: LaneSpec, item_id: int, outcome: store_items.ClaimOutcome
    ) -> ItemContext | None:
        """What a claim's outcome means: the item's context (its lease renewed from now on), or None
        with the reason logged — a deferral or an item its job stopped quietly, anything else as a
        rejection (``message_rejected``)."""
        owner = self.owner
        if owner.locks is not None:
            if outcome.lease is not None:
                owner.locks.claimed(item_id)
            elif outcome.locked:
                owner.locks.conflicted(item_id)
        if outcome.lease is None:
            if outcome.deferred or outcome.refusal in JOB_STOPPED:
                # A deferral, or the doorbell of an item its job paused or cancelled: a normal skip.
                log.debug("item %s skipped: %s", item_id, outcome.reason)
            else:
                self.rejections.record_message(message, outcome.reason)
            return None
        ctx = ItemContext(lease=outcome.lease, spec=spec, engine=owner.engine, worker=owner.worker)
        owner.heartbeat.add(ctx)
        return ctx

    def raised(self, spec: LaneSpec, item_id: int, token: int, exc: Exception) -> str:
        """A claim raised. Store unreachable: the item stays queued and the sweeper re-publishes it.
        Otherwise the failure is recorded on the item: a deterministic error (or one that repeats)
        counts as an attempt and ends the item ``failed`` after the lane's attempt limit, instead
        of the message coming back every few seconds forever. Returns why the message is skipped."""
        kind = classify_store_error(exc)
        error = error_text(exc)
        if kind != UNAVAILABLE:
            try:
                state = store_items.claim_failed(
                    self.owner.engine,
                    spec,
                    item_id,
                    token,
                    error,
                    self.owner.worker,
                    counts=kind == DETERMINISTIC,
                )
            except Exception as again:  # noqa: BLE001 - the store is not answering after all
                log.warning("could not record the failed claim of item %s: %s", item_id, error_text(again))
            else:
                log.warning("claim of item %s failed (%s, %s); item is now %s", item_id, kind, error, state)
                return f"claim failed: {error}"
        log.warning("could not claim item %s (%s); leaving it to the sweeper", item_id, error)
        return f"store unavailable: {error}"


class ChainedClaim:
    """The message's item was claimed by the finish of this process's last item."""

    def __init__(self, preclaims: Preclaims) -> None:
        self.preclaims = preclaims

    def claim(self, spec: LaneSpec, message: dramatiq.Message) -> bool:
        ctx = self.preclaims.take(message)
        if ctx is None:
            return False
        set_current(ctx)
        return True


class SingleClaim:
    """A message naming one item: claimed by compare-and-set in a transaction of its own."""

    def __init__(self, outcomes: Outcomes) -> None:
        self.outcomes = outcomes

    def claim(self, spec: LaneSpec, message: dramatiq.Message) -> bool:
        owner = self.outcomes.owner
        item_id, token = message.args
        locks = lock_request(owner, spec, item_id)
        try:
            outcome = store_items.claim(owner.engine, spec, item_id, token, owner.worker, locks)
        except Exception as exc:  # noqa: BLE001 - judged: unavailable, transient or deterministic
            raise SkipMessage(self.outcomes.raised(spec, item_id, token, exc)) from exc
        ctx = self.outcomes.claimed(message, spec, item_id, outcome)
        if ctx is None:
            raise SkipMessage(outcome.reason)
        set_current(ctx)
        return True


class BatchClaim:
    """A batch message: its items claimed in one transaction (``store.items.claim_batch``); the
    actor then runs the claimed ones in turn (``middleware.batch``). When that transaction fails,
    each item claims on its own, so each failure is judged like a single message's."""

    def __init__(self, outcomes: Outcomes) -> None:
        self.outcomes = outcomes

    def claim(self, spec: LaneSpec, message: dramatiq.Message) -> bool:
        if len(message.args) <= 2:
            return False
        owner, outcomes = self.outcomes.owner, self.outcomes
        pairs = [(int(i), int(t)) for i, t in message_pairs(message.args)]
        requests = {item_id: lock_request(owner, spec, item_id) for item_id, _ in pairs}
        try:
            results = store_items.claim_batch(owner.engine, spec, pairs, owner.worker, requests)
        except Exception as exc:  # noqa: BLE001 - store unreachable: skip; otherwise one by one
            if classify_store_error(exc) == UNAVAILABLE:
                raise SkipMessage(outcomes.raised(spec, pairs[0][0], pairs[0][1], exc)) from exc
            log.info("batch claim failed (%s); claiming its items one by one", error_text(exc))
            results = []
            for item_id, token in pairs:
                try:
                    results.append(
                        store_items.claim(owner.engine, spec, item_id, token, owner.worker, requests[item_id])
                    )
                except Exception as one:  # noqa: BLE001 - recorded on the item, like a single message's
                    reason = outcomes.raised(spec, item_id, token, one)
                    results.append(store_items.ClaimOutcome(None, reason, deferred=True))
        batch = [
            ctx
            for (item_id, _), outcome in zip(pairs, results, strict=True)
            if (ctx := outcomes.claimed(message, spec, item_id, outcome)) is not None
        ]
        if not batch:
            raise SkipMessage("no item of the batch message is claimable")
        set_batch(batch)
        return True


class Claims:
    """The one claim interface: the first strategy for the message claims it."""

    def __init__(self, owner: Owner, rejections: Rejections, preclaims: Preclaims) -> None:
        outcomes = Outcomes(owner, rejections)
        self.strategies: tuple[ClaimStrategy, ...] = (
            BatchClaim(outcomes),
            ChainedClaim(preclaims),
            SingleClaim(outcomes),
        )

    def claim(self, spec: LaneSpec, message: dramatiq.Message) -> None:
        """Claim the valid lane message's item(s) and set the running context, or raise ``SkipMessage``."""
        for strategy in self.strategies:
            if strategy.claim(spec, message):
                return
        raise RuntimeError(f"internal error: no claim strategy for message {message.message_id}")
