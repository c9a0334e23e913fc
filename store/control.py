"""Job control: cancel, pause and resume (the job row locked for update, then its items in ascending id).

Which job states each action applies to is decided here, under the job's row lock, for every caller
(the CLI, the web API, ``Client``, bulk actions): a finished job stays finished (``ControlRefused``,
HTTP 409, the CLI's exit 1)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from sqlalchemy import Engine, func, select, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import is_lock_timeout, lock_timeout_for, shortest_lease_ttl, with_lock_timeout
from .errors import NotApplicable, StoreError, UnknownJob
from .events import emit, emit_many
from .job_end import touched
from .models import CANCEL, CANCELLED, NOT_STARTED, PAUSE, PAUSED, PENDING, QUEUED, Item, Job
from .queries import job_for_change
from .status import derive_job_state

# Which job states each control action applies to; any other state refuses it (``ControlRefused``).
# ``submitting`` may be cancelled (a submission whose submitter died; the sweeper's own end of it).
CONTROL_APPLIES: dict[str, tuple[str, ...]] = {
    "cancel": ("submitting", "running", "pausing", "paused"),
    "pause": ("running",),
    "resume": ("paused", "pausing"),
}
FINISHED_STATES = ("succeeded", "partial", "failed", "cancelled")


class ControlRefused(NotApplicable):
    """A cancel, pause or resume that does not apply to the job's state (pausing a succeeded job)."""

    def __init__(self, action: str, job_id: int, state: str) -> None:
        self.action = action
        self.job_id = job_id
        self.state = state
        applies = ", ".join(CONTROL_APPLIES[action])
        why = "it has finished" if state in FINISHED_STATES else f"{action} applies to {applies} jobs"
        super().__init__(f"cannot {action} job {job_id}: it is {state} ({why})")


class ControlBusy(StoreError):
    """A cancel, pause or resume whose job (or one of its items) stayed locked by another
    transaction past the control path's lock timeouts: nothing changed; try again."""

    def __init__(self, action: str, job_id: int, waited: float) -> None:
        self.action = action
        self.job_id = job_id
        self.waited = waited
        super().__init__(
            f"cannot {action} job {job_id} now: its rows stayed locked by another transaction for "
            f"{waited:.1f} s (a worker frozen or cut off inside a transaction: the store ends it "
            "within its lease TTL); nothing changed, try again"
        )


def _under_lock_timeout(
    engine: Engine, action: str, job_id: int, body: Callable[[Engine], int], ttl: float | None
) -> int:
    """``body`` on ``engine`` with a lock timeout shorter than a lease (``store.engine``), tried
    again while a lock wait runs out, for up to the shortest lease TTL: a frozen worker's
    transaction holding the job or an item is ended by the store within it (PostgreSQL's idle
    timeout), so a control action returns within the TTL plus one lock timeout — done, or
    ``ControlBusy`` (nothing changed), never a hang nor a raw driver error. ``ttl``: the
    shortest lease TTL of the caller's settings (else of the process environment)."""
    ttl = shortest_lease_ttl() if ttl is None else ttl
    waits = with_lock_timeout(engine, lock_timeout_for(ttl))
    started = time.monotonic()
    while True:
        try:
            return body(waits)
        except DBAPIError as exc:
            if not is_lock_timeout(exc):
                raise
            waited = time.monotonic() - started
            if waited >= ttl:
                raise ControlBusy(action, job_id, waited) from None
            time.sleep(0.05)


def _state_now(s: Session, job: Job) -> str:
    """The job's state, read inside the control transaction that holds its row (the one rule of
    ``store.status.derive_job_state``)."""
    totals = dict(
        s.execute(
            select(Item.state, func.count()).where(Item.job_id == job.id).group_by(Item.state)
        ).all()
    )
    return derive_job_state(job.control, totals, bool(job.submitting))


def refuse_unless_applies(s: Session, job: Job, action: str) -> None:
    """Raise ``ControlRefused`` unless ``action`` applies to the job as it is now (the caller holds
    its row): the one place that decides, for the CLI, the API and bulk actions alike."""
    state = _state_now(s, job)
    if state not in CONTROL_APPLIES[action]:
        raise ControlRefused(action, job.id, state)


def _set_items(
    s: Session, job_id: int, from_states: Sequence[str], to_state: str, event: str, why: str
) -> int:
    """The job's items in ``from_states`` become ``to_state`` (the caller holds the job row for
    update). On PostgreSQL they are first locked in ascending id, the order a batch claim and a
    dispatch lock items in: the ``UPDATE`` alone locks them in the order it finds them (heap
    order, which updates shuffle), and a cancel of a 100k-item job that had locked a batch's later
    item while the batch's claim held its earlier one deadlocked with it (CI, December 2026)."""
    where = (Item.job_id == job_id, Item.state.in_(tuple(from_states)))
    if s.get_bind().dialect.name == "postgresql":
        s.execute(select(Item.id).where(*where).order_by(Item.id).with_for_update()).all()
    rows = s.execute(
        update(Item)
        .where(*where)
        .values(state=to_state, queued_at=None, updated_at=db_now())
        .returning(Item.id, Item.photo_id, Item.lane, Item.attempt, Item.fencing_token)
    ).all()
    emit_many(
        s,
        [
            {
                "type": event,
                "job_id": job_id,
                "item_id": r.id,
                "photo_id": r.photo_id,
                "lane": r.lane,
                "attempt": r.attempt,
                "token": r.fencing_token,
                "detail": {"reason": why},
            }
            for r in rows
        ],
    )
    return len(rows)


def _control(engine: Engine, job_id: int, action: str) -> tuple[Session, Job]:
    """Open a control transaction: the job row is locked for update first, then (by the caller) its
    items — the global lock order job -> item -> photo -> intent (``docs/design.md``). Intents of
    items this stops are settled by the sweeper (``store.intents.settle_orphans``). ``action`` must
    apply to the job's state (``ControlRefused`` otherwise, nothing changed)."""
    s = Session(engine)
    s.begin()
    try:
        job = s.execute(job_for_change(job_id)).scalar_one_or_none()
    except BaseException:  # a lock wait that ran out (``_under_lock_timeout`` tries again)
        s.rollback()
        s.close()
        raise
    if job is None:
        s.rollback()
        s.close()
        raise UnknownJob(job_id)
    try:
        refuse_unless_applies(s, job, action)
    except ControlRefused:
        s.rollback()
        s.close()
        raise
    return s, job


def cancel(engine: Engine, job_id: int, *, lease_ttl: float | None = None) -> int:
    """Cancel: not-yet-running items become ``cancelled`` now; running ones are asked to stop.
    ``ControlRefused`` for a finished (or already cancelling) job; ``ControlBusy`` when its rows
    stay locked past the lock timeouts (``_under_lock_timeout``)."""
    return _under_lock_timeout(engine, "cancel", job_id, lambda e: _cancel(e, job_id), lease_ttl)


def _cancel(engine: Engine, job_id: int) -> int:
    s, job = _control(engine, job_id, "cancel")
    with s:
        job.control = CANCEL
        n = _set_items(s, job_id, NOT_STARTED, CANCELLED, "item_cancelled", "job cancelled")
        emit(s, "job_cancel_requested", job_id=job_id, detail={"cancelled_now": n})
        touched(s, job_id)  # with nothing running, the cancel finishes the job
        s.commit()
    return n


class _Switch(NamedTuple):
    """What a pause or a resume does to a job that is not cancelled."""

    action: str  # "pause" or "resume" (``CONTROL_APPLIES``)
    control: str | None  # the job's control afterwards
    from_states: tuple[str, ...]  # its items in these states ...
    to_state: str  # ... move to this one
    item_event: str  # an event each, saying ``why``
    why: str
    job_event: str  # then one for the job, with the count as ``counted``
    counted: str


_PAUSE = _Switch(
    "pause",
    PAUSE, (PENDING, QUEUED), PAUSED, "item_paused", "job paused", "job_pause_requested", "paused_now"
)
_RESUME = _Switch("resume", None, (PAUSED,), PENDING, "item_resumed", "job resumed", "job_resumed", "resumed")


def pause(engine: Engine, job_id: int, *, lease_ttl: float | None = None) -> int:
    """Pause: pending/queued items become ``paused``; running ones stop at their next checkpoint.

    Waiting items stay waiting; when their turn comes during the pause they become paused.
    """
    return _switch(engine, job_id, _PAUSE, lease_ttl)


def resume(engine: Engine, job_id: int, *, lease_ttl: float | None = None) -> int:
    """Resume a paused job: paused items become ``pending`` again."""
    return _switch(engine, job_id, _RESUME, lease_ttl)


def _switch(engine: Engine, job_id: int, how: _Switch, lease_ttl: float | None = None) -> int:
    """Apply a pause or a resume (``how``) to the job when it applies to its state (a cancelled or
    finished job refuses: ``ControlRefused``; rows locked past the lock timeouts: ``ControlBusy``);
    how many items moved."""
    return _under_lock_timeout(engine, how.action, job_id, lambda e: _switch_now(e, job_id, how), lease_ttl)


def _switch_now(engine: Engine, job_id: int, how: _Switch) -> int:
    s, job = _control(engine, job_id, how.action)
    with s:
        job.control = how.control
        n = _set_items(s, job_id, how.from_states, how.to_state, how.item_event, how.why)
        emit(s, how.job_event, job_id=job_id, detail={how.counted: n})
        s.commit()
    return n
