"""Job control: cancel, pause and resume (the job row locked for update, then its items in ascending id)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from .clock import db_now
from .errors import UnknownJob
from .events import emit, emit_many
from .models import CANCEL, CANCELLED, NOT_STARTED, PAUSE, PAUSED, PENDING, QUEUED, Item, Job
from .queries import job_for_change


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


def _control(engine: Engine, job_id: int) -> tuple[Session, Job]:
    """Open a control transaction: the job row is locked for update first, then (by the caller) its
    items — the global lock order job -> item -> photo -> intent (``docs/design.md``). Intents of
    items this stops are settled by the sweeper (``store.intents.settle_orphans``)."""
    s = Session(engine)
    s.begin()
    job = s.execute(job_for_change(job_id)).scalar_one_or_none()
    if job is None:
        s.rollback()
        s.close()
        raise UnknownJob(job_id)
    return s, job


def cancel(engine: Engine, job_id: int) -> int:
    """Cancel: not-yet-running items become ``cancelled`` now; running ones are asked to stop."""
    s, job = _control(engine, job_id)
    with s:
        job.control = CANCEL
        n = _set_items(s, job_id, NOT_STARTED, CANCELLED, "item_cancelled", "job cancelled")
        emit(s, "job_cancel_requested", job_id=job_id, detail={"cancelled_now": n})
        s.commit()
    return n


class _Switch(NamedTuple):
    """What a pause or a resume does to a job that is not cancelled."""

    control: str | None  # the job's control afterwards
    from_states: tuple[str, ...]  # its items in these states ...
    to_state: str  # ... move to this one
    item_event: str  # an event each, saying ``why``
    why: str
    job_event: str  # then one for the job, with the count as ``counted``
    counted: str


_PAUSE = _Switch(
    PAUSE, (PENDING, QUEUED), PAUSED, "item_paused", "job paused", "job_pause_requested", "paused_now"
)
_RESUME = _Switch(None, (PAUSED,), PENDING, "item_resumed", "job resumed", "job_resumed", "resumed")


def pause(engine: Engine, job_id: int) -> int:
    """Pause: pending/queued items become ``paused``; running ones stop at their next checkpoint.

    Waiting items stay waiting; when their turn comes during the pause they become paused.
    """
    return _switch(engine, job_id, _PAUSE)


def resume(engine: Engine, job_id: int) -> int:
    """Resume a paused job: paused items become ``pending`` again."""
    return _switch(engine, job_id, _RESUME)


def _switch(engine: Engine, job_id: int, how: _Switch) -> int:
    """Apply a pause or a resume (``how``) to the job, unless it is cancelled (a cancel is final:
    nothing changes, 0); how many items moved."""
    s, job = _control(engine, job_id)
    with s:
        if job.control == CANCEL:
            s.rollback()
            return 0
        job.control = how.control
        n = _set_items(s, job_id, how.from_states, how.to_state, how.item_event, how.why)
        emit(s, how.job_event, job_id=job_id, detail={how.counted: n})
        s.commit()
    return n
