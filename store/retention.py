"""Retention: finished jobs and old events leave the store (``photojobs prune --older-than 30d``).

A job is pruned when every item has ended (succeeded, failed, cancelled, skipped) and its last item
changed before the cutoff: its items, their photo links, intents and locks, and its events go.
Events older than the cutoff go too, whatever their job. The newest numbered event always stays:
the next cursors continue from it, so a reader's cursor never goes back and never repeats.
Unnumbered events (not yet given a cursor) are never pruned. The newest job also always stays:
SQLite hands out ``max(id) + 1``, so deleting the newest job (and its items) would give the next job
the id of the pruned one. Work is done in batches so no
transaction holds the SQLite write lock for long.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, select
from sqlalchemy.orm import Session

from .clock import db_now
from .events import assign_cursors
from .models import TERMINAL, Event, Intent, Item, ItemPhoto, Job, PhotoLock

BATCH = 5000
JOB_BATCH = 50


@dataclass(frozen=True)
class Pruned:
    jobs: int
    items: int
    events: int
    cutoff: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finished_before(s: Session, cutoff: float, limit: int) -> list[int]:
    unfinished = select(Item.job_id).where(Item.state.not_in(tuple(TERMINAL)))
    last_change = (
        select(Item.job_id, func.max(Item.updated_at).label("last")).group_by(Item.job_id).subquery()
    )
    q = (
        select(Job.id)
        .outerjoin(last_change, last_change.c.job_id == Job.id)
        .where(
            Job.id.not_in(unfinished),
            Job.id < select(func.max(Job.id)).scalar_subquery(),
            func.coalesce(last_change.c.last, Job.created_at) < cutoff,
        )
        .order_by(Job.id)
        .limit(limit)
    )
    return list(s.execute(q).scalars())


def prune(engine: Engine, older_than: float) -> Pruned:
    """Delete finished jobs whose items last changed more than ``older_than`` seconds ago (database
    clock), with their items and events, and every event older than that (except the newest)."""
    if older_than < 0:
        raise ValueError("older_than must be >= 0 seconds")
    assign_cursors(engine)
    with Session(engine) as s:
        cutoff = s.execute(select(db_now())).scalar_one() - older_than
    jobs = items = events = 0
    while True:
        with Session(engine) as s, s.begin():
            ids = _finished_before(s, cutoff, JOB_BATCH)
            if not ids:
                break
            keep = s.execute(select(func.max(Event.seq))).scalar_one() or 0
            item_ids = select(Item.id).where(Item.job_id.in_(ids))
            s.execute(delete(Intent).where(Intent.item_id.in_(item_ids)))
            s.execute(delete(PhotoLock).where(PhotoLock.item_id.in_(item_ids)))
            s.execute(delete(ItemPhoto).where(ItemPhoto.item_id.in_(item_ids)))
            items += s.execute(delete(Item).where(Item.job_id.in_(ids))).rowcount or 0
            events += (
                s.execute(
                    delete(Event).where(Event.job_id.in_(ids), Event.seq.is_not(None), Event.seq < keep)
                ).rowcount
                or 0
            )
            jobs += s.execute(delete(Job).where(Job.id.in_(ids))).rowcount or 0
    while True:
        with Session(engine) as s, s.begin():
            keep = s.execute(select(func.max(Event.seq))).scalar_one() or 0
            # Old events have low cursors: walking the cursor index from the start finds them first.
            batch = (
                select(Event.seq)
                .where(Event.seq.is_not(None), Event.seq < keep, Event.at < cutoff)
                .order_by(Event.seq)
                .limit(BATCH)
            )
            seqs = list(s.execute(batch).scalars())
            if not seqs:
                break
            events += s.execute(delete(Event).where(Event.seq.in_(seqs))).rowcount or 0
        if len(seqs) < BATCH:
            break
    return Pruned(jobs=jobs, items=items, events=events, cutoff=cutoff)


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
