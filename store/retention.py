"""Retention: finished jobs and old events leave the store (``photojobs prune --older-than 30d``).

A job is pruned when every item has ended (succeeded, failed, cancelled, skipped), none of them
still has a recorded (unsettled) intent, it is not still being submitted, and its last item changed
before the cutoff: its items, their photo links, intents and locks, and its events go.
Events older than the cutoff go too, whatever their job. The newest numbered event always stays:
the next cursors continue from it, so a reader's cursor never goes back and never repeats.
Unnumbered events (not yet given a cursor) are never pruned. The newest job also always stays:
SQLite hands out ``max(id) + 1``, so deleting the newest job (and its items) would give the next job
the id of the pruned one. Work is done in batches so no transaction holds the SQLite write lock for long.

Lock order (the global one, job -> item -> photo -> intent -> photo-lock rows): candidates are found
without locks; then, in one transaction, their job rows are locked ``FOR UPDATE`` in ascending id,
then all their items ``FOR UPDATE`` in ascending id, and the decision is taken again under those
locks (a job that a retry, a resume or anything else made unfinished meanwhile is skipped). Only
then are rows deleted: the items (their intents, photo-lock rows and photo links go with them by
``ON DELETE CASCADE``), the events (only those the metric counters have folded: the transaction
folds first, ``store.counters.fold_in``, table ``counters`` last in the lock order), the jobs. A
retry therefore either commits first (the job stays, with its retried items) or waits for the
prune and finds no job (``UnknownJob``). On SQLite the whole decision runs inside the write
transaction (``BEGIN IMMEDIATE``), which serializes it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine, and_, case, delete, exists, func, or_, select
from sqlalchemy.orm import Session

from .clock import db_now
from .counters import fold, fold_in
from .events import assign_cursors
from .idempotency import KEEP, prune_keys
from .intents import RECORDED
from .models import CANCEL, TERMINAL, Event, Intent, Item, Job, JobEnd

BATCH = 5000
JOB_BATCH = 50


@dataclass(frozen=True)
class Pruned:
    jobs: int
    items: int
    events: int
    cutoff: float
    keys: int = 0  # idempotency keys older than their keep time (store.idempotency)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _still_submitting() -> Any:
    return and_(Job.submitting == True, or_(Job.control.is_(None), Job.control != CANCEL))  # noqa: E712


def _candidates(s: Session, cutoff: float, after: int, limit: int) -> list[int]:
    """Jobs that look finished before ``cutoff`` (ids above ``after``, ascending), read without locks."""
    unfinished = select(Item.job_id).where(Item.state.not_in(tuple(TERMINAL)))
    unsettled = select(Item.job_id).join(Intent, Intent.item_id == Item.id).where(Intent.state == RECORDED)
    last_change = (
        select(Item.job_id, func.max(Item.updated_at).label("last")).group_by(Item.job_id).subquery()
    )
    q = (
        select(Job.id)
        .outerjoin(last_change, last_change.c.job_id == Job.id)
        .where(
            Job.id > after,
            Job.id.not_in(unfinished),
            Job.id.not_in(unsettled),
            ~_still_submitting(),
            Job.id < select(func.max(Job.id)).scalar_subquery(),
            func.coalesce(last_change.c.last, Job.created_at) < cutoff,
        )
        .order_by(Job.id)
        .limit(limit)
    )
    return list(s.execute(q).scalars())


def _lock_finished(s: Session, ids: list[int], cutoff: float) -> list[int]:
    """Lock the jobs (ascending id), then all their items (ascending id), and return the jobs that
    are still finished before ``cutoff`` under those locks."""
    jobs = s.execute(
        select(Job.id, Job.created_at)
        .where(Job.id.in_(ids), ~_still_submitting())
        .order_by(Job.id)
        .with_for_update()
    ).all()
    if not jobs:
        return []
    locked = (
        select(Item.job_id, Item.state, Item.updated_at)
        .where(Item.job_id.in_([j.id for j in jobs]))
        .order_by(Item.id)
        .with_for_update()
        .subquery()
    )
    per_job = {
        r.job_id: r
        for r in s.execute(
            select(
                locked.c.job_id,
                func.max(locked.c.updated_at).label("last"),
                func.sum(case((locked.c.state.in_(tuple(TERMINAL)), 0), else_=1)).label("unfinished"),
            ).group_by(locked.c.job_id)
        )
    }
    # An intent is only recorded under its item's row lock (store.intents.record), which we hold.
    unsettled = set(
        s.execute(
            select(Item.job_id)
            .where(
                Item.job_id.in_([j.id for j in jobs]),
                exists().where(Intent.item_id == Item.id, Intent.state == RECORDED),
            )
            .distinct()
        ).scalars()
    )
    finished = []
    for job in jobs:
        agg = per_job.get(job.id)
        last = agg.last if agg is not None else job.created_at
        if (agg is None or not agg.unfinished) and job.id not in unsettled and last < cutoff:
            finished.append(job.id)
    return finished


def prune(engine: Engine, older_than: float, keys_keep: float = KEEP) -> Pruned:
    """Delete finished jobs whose items last changed more than ``older_than`` seconds ago (database
    clock), with their items and events, and every event older than that (except the newest); and
    the idempotency keys older than ``keys_keep`` (``PHOTOJOBS_IDEMPOTENCY_KEEP``).

    Each batch of jobs is decided again under their row locks, taken in the global lock order
    (module docstring), so a job that a concurrent retry or resume brings back to work is kept."""
    if older_than < 0:
        raise ValueError("older_than must be >= 0 seconds")
    assign_cursors(engine)
    fold(engine, number=False)  # most of the folding outside the delete transactions
    with Session(engine) as s:
        cutoff = s.execute(select(db_now())).scalar_one() - older_than
    jobs = items = events = 0
    after = 0
    while True:
        with Session(engine) as s, s.begin():
            candidates = _candidates(s, cutoff, after, JOB_BATCH)
            if not candidates:
                break
            after = candidates[-1]
            ids = _lock_finished(s, candidates, cutoff)
            if not ids:
                continue
            keep = s.execute(select(func.max(Event.seq))).scalar_one() or 0
            # Items first (locked already): their intents, photo-lock rows and photo links go with
            # them (ON DELETE CASCADE), after them in the lock order; then the jobs (locked first).
            items += s.execute(delete(Item).where(Item.job_id.in_(ids))).rowcount or 0
            # The counters last (store.counters): only events they have folded are deleted.
            folded, _ = fold_in(s)
            events += (
                s.execute(
                    delete(Event).where(
                        Event.job_id.in_(ids), Event.seq.is_not(None), Event.seq < keep, Event.seq <= folded
                    )
                ).rowcount
                or 0
            )
            s.execute(delete(JobEnd).where(JobEnd.job_id.in_(ids)))  # no foreign key (store.job_end)
            jobs += s.execute(delete(Job).where(Job.id.in_(ids))).rowcount or 0
    while True:
        with Session(engine) as s, s.begin():
            keep = s.execute(select(func.max(Event.seq))).scalar_one() or 0
            folded, _ = fold_in(s)  # the counters first: only events they have folded are deleted
            # Old events have low cursors: walking the cursor index from the start finds them first.
            batch = (
                select(Event.seq)
                .where(Event.seq.is_not(None), Event.seq < keep, Event.seq <= folded, Event.at < cutoff)
                .order_by(Event.seq)
                .limit(BATCH)
            )
            seqs = list(s.execute(batch).scalars())
            if not seqs:
                break
            events += s.execute(delete(Event).where(Event.seq.in_(seqs))).rowcount or 0
        if len(seqs) < BATCH:
            break
    keys = prune_keys(engine, keys_keep)
    return Pruned(jobs=jobs, items=items, events=events, cutoff=cutoff, keys=keys)


def parse_age(text: str) -> float:
    """``"30d"``, ``"12h"``, ``"90m"``, ``"45s"``, ``"2w"`` or plain seconds -> seconds."""
    raw = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    number, unit = (raw[:-1], raw[-1]) if raw and raw[-1] in units else (raw, "s")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(
            f"age {text!r} is not a number with an optional unit s, m, h, d or w (e.g. 30d)"
        ) from None
    if value < 0:
        raise ValueError(f"age {text!r} must not be negative")
    return value * units[unit]
