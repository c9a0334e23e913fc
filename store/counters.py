"""Persisted metric counters: the event log folded into per-(type, lane) totals that never go back.

The events are the source (append-only, numbered in commit order by ``store.events``). A fold adds
the numbered events past the cursor it folded through to table ``counters`` and moves the cursor,
in one transaction, so a fold is idempotent and an event is counted exactly once:

* the cursor row ``(FOLD_CURSOR, "")`` is locked first (``FOR UPDATE`` on PostgreSQL; SQLite's
  ``BEGIN IMMEDIATE`` write lock serializes writers), so two folds (two web servers, a scrape and
  a prune) run one after the other and the second starts from where the first stopped;
* visible cursors form a prefix (``store.events`` numbers in serialized transactions), so nothing
  folded later can have a cursor below the one folded through.

Lock order: a fold locks ``counters`` rows only (the cursor row, then the counters in (name, lane)
order) and reads events without locks. ``counters`` comes after every table of the global order
(job -> item -> photo -> intent -> photo-lock -> counters): a prune folds inside its delete
transaction after it has locked its jobs and items, and no fold ever waits for one of those.

``store.retention.prune`` deletes only events at or below the cursor its own transaction folded
through (``fold_in``), so a counter never misses an event that a prune removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Engine, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from .engine import reader
from .events import assign_cursors
from .histograms import PREFIX, observe_batch
from .models import Counter, Event

FOLD_CURSOR = "#cursor"  # the counters row holding the cursor folded through (no event type has '#')
FOLD_BATCH = 20_000  # events folded per transaction (SQLite: the write lock is held meanwhile)


@dataclass(frozen=True)
class Counters:
    """A read of the counters: ``values[(event type, lane)]`` (lane ``""``: none) and the cursor
    (``events.seq``) they are folded through."""

    values: dict[tuple[str, str], int]
    cursor: int
    histograms: dict[tuple[str, str], int] = field(default_factory=dict)  # ``store.histograms`` rows

    def get(self, type_: str, lane: str = "") -> int:
        return self.values.get((type_, lane), 0)

    def by_lane(self, type_: str) -> dict[str, int]:
        return {lane: n for (t, lane), n in self.values.items() if t == type_}


def fold_in(s: Session, limit: int | None = None) -> tuple[int, int]:
    """Fold up to ``limit`` (default ``FOLD_BATCH``) numbered events past the cursor into the
    counters, in the caller's transaction (which then holds the cursor row until it ends). Returns
    (cursor folded through, events folded now)."""
    cursor_row = select(Counter.value).where(Counter.name == FOLD_CURSOR, Counter.lane == "")
    cursor = s.execute(cursor_row.with_for_update()).scalar_one()
    batch = (
        select(Event.seq, Event.type, Event.lane, Event.at, Event.job_id, Event.detail)
        .where(Event.seq.is_not(None), Event.seq > cursor)
        .order_by(Event.seq)
        .limit(limit or FOLD_BATCH)
        .subquery()
    )
    groups = s.execute(
        select(batch.c.type, func.coalesce(batch.c.lane, ""), func.count(), func.max(batch.c.seq))
        .group_by(batch.c.type, batch.c.lane)
        .order_by(batch.c.type, func.coalesce(batch.c.lane, ""))
    ).all()
    if not groups:
        return cursor, 0
    dialect = postgresql if s.get_bind().dialect.name == "postgresql" else sqlite
    totals: dict[tuple[str, str], int] = {}
    for type_, lane, n, _ in groups:
        totals[(type_, lane)] = totals.get((type_, lane), 0) + n
    through = max(last for *_, last in groups)
    folded = sum(totals.values())
    totals.update(observe_batch(s, batch, through))  # the duration histograms' buckets (``h:`` rows)
    stmt = dialect.insert(Counter).values(
        [{"name": t, "lane": lane, "value": n} for (t, lane), n in sorted(totals.items())]
    )
    s.execute(
        stmt.on_conflict_do_update(
            index_elements=[Counter.name, Counter.lane], set_={"value": Counter.value + stmt.excluded.value}
        )
    )
    s.execute(update(Counter).where(Counter.name == FOLD_CURSOR, Counter.lane == "").values(value=through))
    return through, folded


def pending(engine: Engine) -> bool:
    """Whether numbered events wait past the cursor (a read, so an idle store's scrape writes nothing)."""
    with Session(reader(engine)) as s:
        cursor = s.execute(
            select(Counter.value).where(Counter.name == FOLD_CURSOR, Counter.lane == "")
        ).scalar_one()
        newest = s.execute(select(func.max(Event.seq))).scalar_one()
    return newest is not None and newest > cursor


def fold(engine: Engine, *, number: bool = True) -> int:
    """Number the committed events (unless ``number`` is false) and fold every numbered one past the
    cursor into the counters, ``FOLD_BATCH`` per transaction; returns how many were folded."""
    if number:
        assign_cursors(engine)
    total = 0
    while pending(engine):
        with Session(engine) as s, s.begin():
            _, n = fold_in(s)
        total += n
        if n == 0:
            break
    return total


def read(engine: Engine) -> Counters:
    """The counters as folded so far (one read of a small table)."""
    with Session(reader(engine)) as s:
        rows = s.execute(select(Counter.name, Counter.lane, Counter.value)).all()
    values = {
        (name, lane): int(value) for name, lane, value in rows if not name.startswith(("#", PREFIX))
    }
    hist = {(name, lane): int(value) for name, lane, value in rows if name.startswith(PREFIX)}
    cursor = next((int(v) for name, _, v in rows if name == FOLD_CURSOR), 0)
    return Counters(values=values, cursor=cursor, histograms=hist)
