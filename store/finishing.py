"""Finishing an item: succeed, fail, stop — each a fenced compare-and-set — and its photo locks' release."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .errors import StaleLease
from .events import emit_for, emit_many, insert_events
from .fencing import DEFERRED_EVENTS, defer_write
from .job_end import UNFINISHED, touched
from .lanes import LaneSpec
from .leases import Lease
from .models import CANCELLED, FAILED, PAUSED, PENDING, RUNNING, SUCCEEDED, TERMINAL, Item, Job
from .photo_locks import chunked, lock_photo_rows
from .pipeline import advance, lock_bundle, lock_items, lock_job, skip_later, state_for, successor_ids
from .queries import (
    DROP_LOCKS,
    DROP_LOCKS_UNLESS_INTENT,
    DROP_MANY_LOCKS_UNLESS_INTENT,
    LIVE_INTENT,
    LOCKS_TO_INTENT,
    RENEW_KEY,
    end_lease_sql,
    event_sql,
    succeed_many_sql,
)

BATCH_LOCKED = "batch_locked_items"  # session.info: the items lock_batch_finish row-locked


def lock_for_finish(s: Session, lease: Lease) -> str | None:
    """The job's share lock and control request, taken once per finishing transaction and job (a
    batch finish ends several items of a job), before the item (lock order job -> item). Only a
    finish that needs the control request takes it (a retry, a stop, a successor to make ready): a
    last-lane success touches no job row."""
    key = ("finish_locked", lease.job_id)
    if key in s.info:
        return s.info[key]  # type: ignore[no-any-return]
    control = lock_job(s, lease.job_id)
    s.info[key] = control
    return control


def lock_batch_finish(s: Session, leases: Sequence[Lease], plain: Collection[int] = ()) -> None:
    """Before a batch finish writes anything (PostgreSQL): its jobs share-locked, then its items
    together with the rows their finishes may move on (the next lane's waiting items of their
    photos, or a waiting bundle: ``lock_successors``), then its photos, each set in ascending id —
    the global order job -> item -> photo, which the finishes one after another (each job, item,
    photo, photo-lock rows in turn, then the next item) would cross between items. The jobs'
    control requests are kept for ``lock_for_finish``. ``plain``: the items that end by
    ``succeed_many`` (their own row and event only), whose photos need no lock. SQLite serializes
    whole transactions."""
    if s.get_bind().dialect.name != "postgresql" or not leases:
        return
    jobs = sorted({lease.job_id for lease in leases})
    controls = s.execute(
        select(Job.id, Job.control).where(Job.id.in_(jobs)).order_by(Job.id).with_for_update(read=True)
    ).all()
    for job_id, control in controls:
        s.info[("finish_locked", job_id)] = control
    items = {lease.item_id for lease in leases}
    s.info[BATCH_LOCKED] = set(items)
    items |= successor_ids(s, [(x.job_id, x.position, x.photo_ids) for x in leases if not _last_lane(x)])
    lock_items(s, items)
    photos = [p for lease in leases if lease.item_id not in plain for p in lease.photo_ids]
    if photos:
        lock_photo_rows(s.connection(), photos)


def plain_success(lease: Lease, writes: Sequence[Callable[[Session], None]] = ()) -> bool:
    """Whether a success of the lease writes its own item's row and event only: a last lane (no next
    lane's item or bundle to make ready), no photo locks to release, no writes of the actor's
    (``writes``) — what ``succeed_many`` may finish together."""
    return _last_lane(lease) and not lease.holds_locks and not writes


def succeed_many(s: Session, done: Sequence[tuple[Lease, dict[str, Any] | None]], worker: str | None) -> None:
    """``succeed`` for several ``plain_success`` leases at once (a batch message's items, in its
    fenced batch session): one compare-and-set for all the items with the same result
    (``store.queries.succeed_many_sql``; a batch's no-op results are alike), which is every one's
    fence as ``succeed``'s is, and their events with the batch's. Raises ``StaleLease`` (the
    caller's transaction rolls back whole) when any lease no longer holds. On PostgreSQL the items
    are row-locked first in ascending id, unless ``lock_batch_finish`` has."""
    if not done:
        return
    if not all(plain_success(lease) for lease, _ in done):
        raise ValueError("succeed_many takes plain successes only (store.finishing.plain_success)")
    conn = s.connection()
    dialect = conn.dialect.name
    if dialect == "postgresql" and not {x.item_id for x, _ in done} <= s.info.get(BATCH_LOCKED, set()):
        lock_items(s, [x.item_id for x, _ in done])
    groups: dict[str, list[tuple[Lease, dict[str, Any] | None]]] = {}
    for lease, result in sorted(done, key=lambda d: d[0].item_id):
        groups.setdefault(json.dumps(result, sort_keys=True, default=str), []).append((lease, result))
    events: list[dict[str, Any]] = []
    for group in groups.values():
        params = {
            "ids": [lease.item_id for lease, _ in group],
            "keys": [lease.item_id * RENEW_KEY + lease.token for lease, _ in group],
            "result": group[0][1],
        }
        matched = set(conn.execute(succeed_many_sql(dialect), params).scalars())
        for lease, result in group:
            _fence_held(s, lease, lease.item_id if lease.item_id in matched else None)
            events.append(
                {
                    "type": "item_succeeded",
                    "job_id": lease.job_id,
                    "item_id": lease.item_id,
                    "photo_id": lease.photo_id,
                    "lane": lease.lane,
                    "attempt": lease.attempt,
                    "token": lease.token,
                    "worker": worker,
                    "detail": _timed({"result": result} if result else {}, lease),
                }
            )
    deferred = s.info.get(DEFERRED_EVENTS)
    if deferred is not None:
        deferred.extend(events)
    else:
        insert_events(conn, events)
    touched(s, {lease.job_id for lease, _ in done})  # last lanes: maybe the jobs' last items


def _last_lane(lease: Lease) -> bool:
    """Nothing follows the lease's lane in its job (no next lane's item, no bundle to release)."""
    return bool(lease.job_lanes) and lease.position >= len(lease.job_lanes) - 1


RELEASES = "lock_releases"  # session.info: a batch finish's items whose locks go at its end


def release_locks_later(s: Session, item_id: int) -> None:
    """``release_locks`` of a success whose return nobody reads: in a batch finish, with the other
    items' releases in one statement before the commit (``release_locks_together``); else now."""
    if defer_write(s, RELEASES, 2, release_locks_together):
        s.info.setdefault(RELEASES, []).append(item_id)
    else:
        release_locks(s, item_id)


def release_locks_together(s: Session) -> None:
    """The releases ``release_locks_later`` kept: every item's rows dropped by one statement unless
    it has an unsettled intent; an item it did not drop is released on its own (its rows go to the
    intent)."""
    items = sorted(set(s.info.pop(RELEASES, [])))
    dropped: set[int] = set()
    conn = s.connection()
    for chunk in chunked(items):
        dropped.update(conn.execute(DROP_MANY_LOCKS_UNLESS_INTENT, {"ids": list(chunk)}).scalars())
    for item_id in items:
        if item_id not in dropped:
            release_locks(s, item_id)


def release_locks(s: Session, item_id: int) -> int | None:
    """An item's lease ended: drop its photo locks, unless it has an unsettled intent; then the
    intent holds them (returned) until it is settled (``store.intents``)."""
    conn = s.connection()
    if conn.execute(DROP_LOCKS_UNLESS_INTENT, {"item_id": item_id}).rowcount:
        return None  # no unsettled intent: the rows are gone (one statement on the hot path)
    live = conn.execute(LIVE_INTENT, {"item_id": item_id}).scalar_one_or_none()
    if live is None:
        conn.execute(DROP_LOCKS, {"item_id": item_id})
    else:
        conn.execute(LOCKS_TO_INTENT, {"item_id": item_id, "intent_id": live})
    return live


def _stale(s: Session, lease: Lease) -> StaleLease:
    row = s.execute(select(Item.state, Item.fencing_token).where(Item.id == lease.item_id)).first()
    return StaleLease(
        lease.item_id, lease.token, row.state if row else None, row.fencing_token if row else None
    )


def _fence_held(s: Session, lease: Lease, row: Any) -> None:
    """The finishing compare-and-set matched (the lease held, and its row stays locked until the
    commit): the fenced session needs no separate check. No row: the lease is stale."""
    if row is None:
        raise _stale(s, lease)
    s.info["fence_verified"] = True
    s.info.setdefault("fenced_items", set()).add(lease.item_id)


def _end_lease(s: Session, lease: Lease, *, release: bool = True, **values: Any) -> None:
    """CAS the running item to its next state (the fence folded into the ``WHERE``) and release its
    photo locks (``release`` False: the caller does, later). A finish that reads the job's control
    request locked the job first. An item that ends here (failed, or cancelled: a cooperative stop,
    or a failure with attempts left on a cancelled job) may be its job's last: the commit checks
    (``store.job_end.touched``)."""
    row = s.execute(
        update(Item)
        .where(Item.id == lease.item_id, Item.fencing_token == lease.token, Item.state == RUNNING)
        .values(lease_owner=None, lease_expires_at=None, updated_at=db_now(), **values)
        .returning(Item.id)
    ).first()
    _fence_held(s, lease, row)
    if values.get("state") in TERMINAL:
        touched(s, lease.job_id)
    if release and lease.holds_locks:
        release_locks(s, lease.item_id)


def succeed(
    s: Session,
    lease: Lease,
    result: dict[str, Any] | None,
    worker: str | None,
    writes: Sequence[Callable[[Session], None]] = (),
) -> None:
    """Finish a running item as ``succeeded`` (fenced session): one compare-and-set that is also
    the fence, the photo's next lane made ready, then ``writes`` (the actor's own rows, e.g. the
    photo's hash), the lock release and the events (the success before the next lane's).

    Lock order (job -> item -> photo -> photo-lock rows): a middle lane share-locks the job and
    the waiting bundle it may release (created before its job's photo items: a lower id) before
    its own row, and makes the next lane's items ready before it writes its photo or drops its
    photo-lock rows."""
    last_lane = _last_lane(lease)
    bundle = None
    control: str | None = None
    if not last_lane:
        control = lock_for_finish(s, lease)  # job -> item: the next lane's state follows it
        bundle = lock_bundle(s, lease.job_id, lease.position + 1, lease.photo_ids)
    conn = s.connection()
    dialect = conn.dialect.name
    row = conn.execute(
        end_lease_sql(dialect, SUCCEEDED, result=True),
        {"item_id": lease.item_id, "token": lease.token, "result": result},
    ).first()
    _fence_held(s, lease, row)
    ready: list[dict[str, Any]] = []
    if not last_lane:
        ready = advance(s, lease.job_id, lease.position, lease.photo_ids, state_for(control), bundle)
    for write in writes:
        write(s)
    if lease.holds_locks:
        release_locks_later(s, lease.item_id)
    succeeded = {
        "type": "item_succeeded",
        "job_id": lease.job_id,
        "item_id": lease.item_id,
        "photo_id": lease.photo_id,
        "lane": lease.lane,
        "attempt": lease.attempt,
        "token": lease.token,
        "worker": worker,
        "detail": _timed({"result": result} if result else {}, lease),
    }
    deferred = s.info.get(DEFERRED_EVENTS)
    if deferred is not None and last_lane:
        # A batch finish (store.fencing.fenced_batch) inserts its rows together before the commit;
        # only a last lane's: nothing follows it, so the events keep their order within the item
        # (a next lane's ``item_ready`` always comes after its predecessor's success).
        deferred.append(succeeded)
    else:
        conn.execute(event_sql(dialect), succeeded)
    emit_many(s, ready)
    if last_lane or not any((r.get("detail") or {}).get("state") in UNFINISHED for r in ready):
        # a middle lane that made a successor ready (pending/paused) leaves its job unfinished
        touched(s, lease.job_id)


def _timed(detail: dict[str, Any], lease: Lease) -> dict[str, Any] | None:
    """An attempt's finish event detail with its claim's time (``claimed_at``, database clock): the
    event's own time minus it is the attempt's run time (``photojobs_item_run_seconds``)."""
    if lease.claimed_at is not None:
        detail["claimed_at"] = round(float(lease.claimed_at), 4)
    return detail or None


def fail(
    s: Session,
    spec: LaneSpec,
    lease: Lease,
    error: str,
    worker: str | None,
    *,
    retry: bool = True,
    trace: str | None = None,
) -> str:
    """Finish a running item after an error: ``pending`` with backoff while attempts remain, else ``failed``.

    Returns the new state. A failure for good skips the photo's later lanes (``skip_successors``)
    before it drops its photo-lock rows (lock order: items before photo-lock rows). ``trace``: the
    traceback of an unexpected exception (already bounded, ``store.errors.bounded_trace``), kept in
    the attempt's event (the item page lists every attempt's error).
    """
    extra: dict[str, Any] = {"traceback": trace} if trace else {}
    control = lock_for_finish(s, lease)
    if retry and lease.attempt < spec.max_attempts:
        delay = spec.retry_delay(lease.attempt)
        state = state_for(control)
        _end_lease(s, lease, state=state, error=error, not_before=db_now() + delay)
        detail = {"error": error, "delay": delay, "state": state, **extra}
        emit_for(s, "item_retry_scheduled", lease, worker, _timed(detail, lease))
        return state
    bundle = lock_bundle(s, lease.job_id, lease.position + 1, lease.photo_ids, failed=True)
    _end_lease(s, lease, release=False, state=FAILED, error=error)
    reason = f"{lease.lane} failed: {error}"
    skipped = skip_later(s, lease.job_id, lease.position, lease.photo_ids, reason, state_for(control), bundle)
    if lease.holds_locks:
        release_locks(s, lease.item_id)
    emit_for(s, "item_failed", lease, worker, _timed({"error": error, **extra}, lease))
    emit_many(s, skipped)
    return FAILED


def stop(s: Session, lease: Lease, worker: str | None, reason: str, *, delay: float | None = None) -> str:
    """End a running item that stopped cooperatively, as its job asks *now* (read in this
    transaction, under a share lock): ``cancelled``, ``paused``, or back to ``pending`` (a resume
    came first, the worker is shutting down, or the item deferred itself: ``delay`` seconds before
    it is dispatched again). A stop that was not a failure does not use up an
    attempt, whichever state it ends in: the claim's attempt is handed back on cancel as on pause
    (a batch-mate cancelled before its turn never ran)."""
    state = state_for(lock_for_finish(s, lease))
    if state == CANCELLED:
        _end_lease(s, lease, state=CANCELLED, attempt=Item.attempt - 1)
        emit_for(s, "item_cancelled", lease, worker, {"reason": reason})
        return CANCELLED
    later = {"not_before": db_now() + delay} if delay is not None and state == PENDING else {}
    _end_lease(s, lease, state=state, attempt=Item.attempt - 1, **later)
    emit_for(
        s,
        "item_paused" if state == PAUSED else "item_released",
        lease,
        worker,
        {"reason": reason, "state": state},
    )
    return state
