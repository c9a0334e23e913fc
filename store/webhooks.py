"""Webhook delivery state (``webhook_state``, revision 0016): one deliverer per target, at least once.

A target is the SHA-256 of its URL. Its row holds the event cursor delivered through, the current
event's failed attempts and when the next one is due, the last answer, the counts, and the
sweeper that delivers it (``owner`` until ``lease_expires_at``):

- :func:`claim` is the compare-and-set that makes one deliverer across fleets: a sweeper takes (or
  renews) the row when it is free, its own, or its lease has expired — like the sweeper's duties,
  a row claimed, never a lock held across the HTTP request;
- :func:`next_delivery` is the first ``job_finished`` event after the cursor (the events numbered
  first, ``store.events.assign_cursors``), or None when there is none or the next attempt is not due;
- :func:`delivered` moves the cursor past the event only after the receiver answered 2xx, and only
  while the caller still owns the row (a deliverer that lost its lease records nothing: the new
  owner sends the event again — at least once, never skipped); :func:`failed` counts the attempt
  and sets the next one after a capped exponential backoff.

Every time is the database clock (``store.clock``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from .clock import db_now
from .engine import reader
from .events import assign_cursors
from .models import Event, WebhookState

EVENT = "job_finished"


def target_of(url: str) -> str:
    """A target's key: the SHA-256 (hex) of its URL."""
    return hashlib.sha256(url.encode()).hexdigest()


def backoff(attempts: int, base: float, cap: float) -> float:
    """Seconds before the next attempt after ``attempts`` failed ones: ``base`` doubled per failure,
    at most ``cap``."""
    return min(cap, base * 2.0 ** max(0, attempts - 1))


@dataclass(frozen=True)
class Delivery:
    """One event to deliver: its cursor, job, detail, and how many attempts at it failed so far."""

    target: str
    cursor: int
    job: int
    state: str | None
    counts: dict[str, int]
    attempts: int

    def body(self) -> dict[str, Any]:
        """The JSON body the receiver gets."""
        return {
            "event": EVENT,
            "job": self.job,
            "state": self.state,
            "counts": self.counts,
            "cursor": self.cursor,
        }


def ensure(engine: Engine, target: str, host: str) -> None:
    """The target's row, created at cursor 0 (every ``job_finished`` in the log) when missing."""
    with engine.begin() as conn:
        if conn.execute(select(WebhookState.target).where(WebhookState.target == target)).first():
            return
        try:
            with conn.begin_nested():
                conn.execute(insert(WebhookState).values(target=target, host=host))
        except IntegrityError:
            pass  # another sweeper created it first


def claim(engine: Engine, target: str, owner: str, lease: float) -> bool:
    """Take or renew the delivery of ``target`` for ``lease`` seconds: a compare-and-set that
    matches when the row is free, held by ``owner``, or its lease expired. True when ``owner`` holds it."""
    now = db_now()
    with engine.begin() as conn:
        n = conn.execute(
            update(WebhookState)
            .where(
                WebhookState.target == target,
                (WebhookState.owner.is_(None))
                | (WebhookState.owner == owner)
                | (WebhookState.lease_expires_at < now),
            )
            .values(owner=owner, lease_expires_at=now + lease)
        ).rowcount
    return n == 1


def release(engine: Engine, target: str, owner: str) -> None:
    """Give the delivery up (a clean stop): another sweeper takes it at its next run."""
    with engine.begin() as conn:
        conn.execute(
            update(WebhookState)
            .where(WebhookState.target == target, WebhookState.owner == owner)
            .values(owner=None, lease_expires_at=None)
        )


def next_delivery(engine: Engine, target: str) -> Delivery | None:
    """The first ``job_finished`` event after the target's cursor, or None (none, or the next
    attempt is not due yet)."""
    assign_cursors(engine)
    with reader(engine).connect() as conn:
        row = conn.execute(
            select(
                WebhookState.cursor, WebhookState.attempts, WebhookState.next_attempt_at <= db_now()
            ).where(WebhookState.target == target)
        ).first()
        if row is None or not row[2]:
            return None
        ev = conn.execute(
            select(Event.seq, Event.job_id, Event.detail)
            .where(Event.type == EVENT, Event.seq.is_not(None), Event.seq > row.cursor)
            .order_by(Event.seq)
            .limit(1)
        ).first()
    if ev is None:
        return None
    detail = ev.detail or {}
    return Delivery(
        target=target,
        cursor=int(ev.seq),
        job=int(ev.job_id),
        state=detail.get("state"),
        counts=dict(detail.get("counts") or {}),
        attempts=int(row.attempts),
    )


def delivered(engine: Engine, d: Delivery, owner: str, status: int, lease: float) -> bool:
    """The receiver answered ``status`` (2xx): the cursor moves past ``d``'s event, the attempts
    start again, the lease is renewed. False (nothing written) when ``owner`` lost the row."""
    now = db_now()
    with engine.begin() as conn:
        n = conn.execute(
            update(WebhookState)
            .where(
                WebhookState.target == d.target, WebhookState.owner == owner, WebhookState.cursor < d.cursor
            )
            .values(
                cursor=d.cursor,
                attempts=0,
                next_attempt_at=0.0,
                delivered=WebhookState.delivered + 1,
                last_status=status,
                last_error=None,
                last_attempt_at=now,
                last_delivered_at=now,
                lease_expires_at=now + lease,
            )
        ).rowcount
    return n == 1


def failed(
    engine: Engine, d: Delivery, owner: str, status: int | None, error: str, *, base: float, cap: float
) -> float:
    """An attempt at ``d`` failed (``status`` None: no answer): counted, the next one due after
    :func:`backoff`. Returns that delay."""
    delay = backoff(d.attempts + 1, base, cap)
    now = db_now()
    with engine.begin() as conn:
        conn.execute(
            update(WebhookState)
            .where(
                WebhookState.target == d.target, WebhookState.owner == owner, WebhookState.cursor < d.cursor
            )
            .values(
                attempts=WebhookState.attempts + 1,
                failures=WebhookState.failures + 1,
                next_attempt_at=now + delay,
                last_status=status,
                last_error=error[:500],
                last_attempt_at=now,
            )
        )
    return delay


def status(engine: Engine) -> list[dict[str, Any]]:
    """Every target's delivery state, with ``lag``: the ``job_finished`` events after its cursor."""
    assign_cursors(engine)
    with reader(engine).connect() as conn:
        rows = conn.execute(select(WebhookState).order_by(WebhookState.host, WebhookState.target)).all()
        out = []
        for r in rows:
            lag = conn.execute(
                select(func.count())
                .select_from(Event)
                .where(Event.type == EVENT, Event.seq.is_not(None), Event.seq > r.cursor)
            ).scalar_one()
            out.append(
                {
                    "target": r.target,
                    "host": r.host,
                    "cursor": int(r.cursor),
                    "lag": int(lag),
                    "delivered": int(r.delivered),
                    "failures": int(r.failures),
                    "attempts": int(r.attempts),
                    "next_attempt_at": r.next_attempt_at or None,
                    "last_status": r.last_status,
                    "last_error": r.last_error,
                    "last_attempt_at": r.last_attempt_at,
                    "last_delivered_at": r.last_delivered_at,
                    "owner": r.owner,
                    "lease_expires_at": r.lease_expires_at,
                }
            )
    return out
