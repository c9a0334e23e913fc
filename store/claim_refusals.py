"""A claim that did not take its item: the second look (why not), the deferrals, a claim that raised."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .events import emit, emit_for
from .job_end import touched
from .lane_control import lane_paused
from .lanes import LaneSpec
from .leases import ClaimOutcome, ClaimRefusal
from .models import CANCELLED, FAILED, PAUSED, PENDING, QUEUED, Item, Job
from .photo_locks import Conflict, LockRequest
from .pipeline import item_photo_ids, lock_job, ready_state, skip_successors

CLAIMABLE = (QUEUED, PENDING)  # the states a claim takes an item from (``store.queries.claim_sql``)
_REFUSAL_OF_STATE = {PAUSED: ClaimRefusal.PAUSED, CANCELLED: ClaimRefusal.CANCELLED}


def locked_outcome(conflict: Conflict) -> ClaimOutcome:
    """The outcome of a claim deferred because a photo of its item is locked by other work."""
    reason = f"photo {conflict.photo_id} locked by item {conflict.held_by}"
    return ClaimOutcome(None, reason, True, True, ClaimRefusal.LOCKED)


def unclaim(
    conn: Connection, lane: str, item_id: int, row: Any, worker: str, delay: float, conflict: Conflict
) -> None:
    """Undo a claim's compare-and-set inside its own transaction (a photo of the item is locked by
    other work): token, attempt and lease as before the claim, and the item back to ``pending`` for
    ``delay`` seconds (``item_deferred``), as a claim that rolled back and deferred leaves it."""
    conn.execute(
        update(Item)
        .where(Item.id == item_id, Item.fencing_token == row.fencing_token)
        .values(
            state=PENDING,
            fencing_token=row.fencing_token - 1,
            attempt=row.attempt - 1,
            lease_owner=None,
            lease_expires_at=None,
            queued_at=None,
            not_before=db_now() + delay,  # ``updated_at`` kept: when it became ready (see ``_defer``)
        )
    )
    emit(
        conn,
        "item_deferred",
        job_id=row.job_id,
        item_id=item_id,
        photo_id=row.photo_id,
        lane=lane,
        attempt=row.attempt - 1,
        token=row.fencing_token - 1,
        worker=worker,
        detail={"reason": "photo locked", "photo": conflict.photo_id, "held_by": conflict.held_by},
    )


def defer_locked(
    engine: Engine, item_id: int, token: int, worker: str, request: LockRequest, conflict: Conflict
) -> ClaimOutcome:
    """A photo of the item is locked by other work: back to ``pending`` for a while, holding nothing
    (the message's (item, token) is checked again: another delivery may have moved it on)."""
    with Session(engine) as s, s.begin():
        item = s.execute(select(Item).where(Item.id == item_id).with_for_update()).scalar_one_or_none()
        if item is None or item.fencing_token != token or item.state not in CLAIMABLE:
            reason = f"item {item_id} moved on while its photos were locked"
            return ClaimOutcome(None, reason, refusal=ClaimRefusal.MOVED_ON)
        _defer(
            s,
            item,
            worker,
            request.retry_after,
            {"reason": "photo locked", "photo": conflict.photo_id, "held_by": conflict.held_by},
        )
    return locked_outcome(conflict)


def not_claimed(engine: Engine, spec: LaneSpec, item_id: int, token: int, worker: str) -> ClaimOutcome | None:
    """Why the claim's compare-and-set matched nothing (off the hot path: stray, stale or early
    messages). A job still being submitted defers the item; everything else is a skip. None: the
    item is claimable now (it changed between the two transactions: another delivery released it)."""
    with Session(engine) as s, s.begin():
        row = s.execute(
            select(Item, Job.submitting)
            .join(Job, Job.id == Item.job_id)
            .where(Item.id == item_id)
            .with_for_update(of=Item)
        ).first()
        if row is None:
            return ClaimOutcome(None, f"unknown item {item_id}", refusal=ClaimRefusal.UNKNOWN_ITEM)
        item, submitting = row
        if item.lane != spec.name:
            reason = f"item {item_id} belongs to lane {item.lane!r}, not {spec.name!r}"
            return ClaimOutcome(None, reason, refusal=ClaimRefusal.OTHER_LANE)
        if item.fencing_token != token:
            reason = f"stale token {token}: item {item_id} is at token {item.fencing_token}"
            return ClaimOutcome(None, reason, refusal=ClaimRefusal.STALE_TOKEN)
        if item.state not in CLAIMABLE:
            refusal = _REFUSAL_OF_STATE.get(item.state, ClaimRefusal.NOT_CLAIMABLE)
            return ClaimOutcome(None, f"item {item_id} is {item.state}, not claimable", refusal=refusal)
        if submitting:  # the dispatcher passes such jobs over; a stray message waits too
            _defer(s, item, worker, 1.0, {"reason": "job still being submitted"})
            reason = f"job {item.job_id} is still being submitted"
            return ClaimOutcome(None, reason, True, refusal=ClaimRefusal.SUBMITTING)
        if lane_paused(s, item.lane):  # the dispatcher sends it again after the resume
            _defer(s, item, worker, 1.0, {"reason": "lane paused"})
            return ClaimOutcome(None, f"lane {item.lane} is paused", True, refusal=ClaimRefusal.LANE_PAUSED)
    return None


def changed_outcome(item_id: int) -> ClaimOutcome:
    """The item was claimable at the second look, and its claim again matched nothing."""
    reason = f"item {item_id} changed while being claimed; skipped"
    return ClaimOutcome(None, reason, refusal=ClaimRefusal.CHANGED)


def _defer(s: Session, item: Item, worker: str | None, delay: float, detail: dict[str, Any]) -> None:
    """The item (queued/pending, row locked) goes back to ``pending`` for ``delay`` s, holding nothing."""
    s.execute(
        update(Item)
        .where(Item.id == item.id)
        # ``updated_at`` stays when the item became ready: a deferral is a wait, not a new start
        # (the claim's ``ready_at``, the lane's oldest ready age in /metrics).
        .values(state=PENDING, queued_at=None, not_before=db_now() + delay)
    )
    emit_for(s, "item_deferred", item, worker, detail)


def claim_failed(
    engine: Engine, spec: LaneSpec, item_id: int, token: int, error: str, worker: str, *, counts: bool
) -> str | None:
    """Record a claim that raised instead of claiming (the store answered, the claim did not work).

    It counts as an attempt when ``counts`` (a deterministic error: a programming or data error,
    too many bind parameters) or when it is the same error as the item's last failed claim (an
    error that repeats will not pass by itself): the token moves on, ``item_claim_failed`` is
    written, and once the lane's attempts are spent the item ends ``failed`` with the error (later
    lanes of its photos are skipped). A first, possibly passing error only defers the item with
    backoff (``item_deferred``). Returns the item's new state, or None when (item, token) is no
    longer claimable (someone else moved it on)."""
    message = f"claim failed: {error}"
    with Session(engine) as s, s.begin():
        # Lock order job -> item (as cancel/pause and the sweeper): the job first, then the item.
        job_id = s.execute(select(Item.job_id).where(Item.id == item_id)).scalar_one_or_none()
        if job_id is None:
            return None
        lock_job(s, job_id)
        item = s.execute(select(Item).where(Item.id == item_id).with_for_update()).scalar_one_or_none()
        if item is None or item.fencing_token != token or item.state not in CLAIMABLE:
            return None
        if not counts and item.error != message:
            _defer(
                s,
                item,
                worker,
                spec.retry_delay(item.attempt + 1),
                {"reason": "claim failed", "error": error},
            )
            s.execute(update(Item).where(Item.id == item_id).values(error=message))
            return PENDING
        attempt, new_token = item.attempt + 1, token + 1
        exhausted = attempt >= spec.max_attempts
        state = FAILED if exhausted else ready_state(s, item.job_id)
        s.execute(
            update(Item)
            .where(Item.id == item_id, Item.fencing_token == token)
            .values(
                state=state,
                attempt=attempt,
                fencing_token=new_token,
                queued_at=None,
                error=message,
                not_before=db_now() + spec.retry_delay(attempt),
                updated_at=db_now(),
            )
        )
        common: dict[str, Any] = {
            "job_id": item.job_id,
            "item_id": item_id,
            "photo_id": item.photo_id,
            "lane": item.lane,
            "attempt": attempt,
            "token": new_token,
            "worker": worker,
        }
        emit(s, "item_claim_failed", **common, detail={"error": error, "state": state})
        if exhausted:
            emit(s, "item_failed", **common, detail={"error": message})
            photos = item_photo_ids(s, item.id, item.photo_id)
            skip_successors(s, item.job_id, item.position, photos, f"{item.lane} {message}")
        if state in (FAILED, CANCELLED):
            touched(s, item.job_id)
        return state
