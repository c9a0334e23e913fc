"""The event log: written in the same transaction as each state change, read by cursor.

The sequence-gap problem: on PostgreSQL an ``id`` taken from a sequence is visible only when its
transaction commits, and transactions commit out of id order, so a reader following
``id > last`` can pass over a row that commits a moment later. We never give readers ``id``.
Each event is inserted with ``seq = NULL``; ``assign_cursors`` numbers the committed, unnumbered
rows in one transaction that holds a global lock (``pg_advisory_xact_lock`` on PostgreSQL, the
``BEGIN IMMEDIATE`` write lock on SQLite). Numbering transactions are serialized and each
continues from the previous one's maximum, so ``seq`` values become visible in increasing order:
a reader that has seen ``seq = n`` will see every later event with ``seq > n``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, func, insert, select, text
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .models import Event, Item
from .queries import EVENT_COLUMNS, EVENTS_UNNEST_PG, event_sql

if TYPE_CHECKING:
    from .leases import Lease

EVENT_SEQUENCER_LOCK = 0x70686F746F  # "photo"
MAX_BATCH = 5000  # events numbered per transaction (SQLite: the write lock is held meanwhile)


def emit(
    session: Session | Connection,
    type: str,
    *,
    job_id: int | None = None,
    item_id: int | None = None,
    photo_id: int | None = None,
    lane: str | None = None,
    attempt: int | None = None,
    token: int | None = None,
    worker: str | None = None,
    detail: dict[str, Any] | None = None,
) -> None:
    """Record one event in the caller's transaction."""
    session.execute(
        insert(Event).values(
            type=type,
            job_id=job_id,
            item_id=item_id,
            photo_id=photo_id,
            lane=lane,
            attempt=attempt,
            token=token,
            worker=worker,
            detail=detail,
            at=db_now(),
        )
    )


def emit_for(
    session: Session | Connection,
    type: str,
    of: Lease | Item,
    worker: str | None,
    detail: dict[str, Any] | None = None,
    **instead: int | None,
) -> None:
    """Record one event of an attempt (its ``Lease``) or of an item (its row as read): its job,
    item, photo, lane, attempt and token; ``instead`` (``attempt``, ``token``, ``photo_id``) where
    the event speaks of another (a change the row does not show yet, one photo of the item)."""
    item_id, token = (of.id, of.fencing_token) if isinstance(of, Item) else (of.item_id, of.token)
    columns: dict[str, Any] = {"job_id": of.job_id, "item_id": item_id, "photo_id": of.photo_id}
    columns |= {"lane": of.lane, "attempt": of.attempt, "token": token, **instead}
    emit(session, type, **columns, worker=worker, detail=detail)


def emit_many(session: Session | Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Record many events in the caller's transaction (each row: the keyword arguments of ``emit``)."""
    if not rows:
        return
    keys = ("type", "job_id", "item_id", "photo_id", "lane", "attempt", "token", "worker", "detail")
    # The database clock in the statement itself (no SELECT of it first).
    session.execute(insert(Event).values(at=db_now()), [{k: r.get(k) for k in keys} for r in rows])


def insert_events(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Insert event rows (each with ``store.queries.EVENT_COLUMNS``' keys; missing ones are NULL) in
    the caller's transaction, stamped with the database clock, in the order given: on PostgreSQL
    in one statement whatever their number (``EVENTS_UNNEST_PG``), on SQLite as an executemany
    (in-process, no round trips)."""
    if not rows:
        return
    dialect = conn.dialect.name
    if dialect != "postgresql" or len(rows) == 1:
        conn.execute(event_sql(dialect), [{k: r.get(k) for k in EVENT_COLUMNS} for r in rows])
        return
    columns: dict[str, list[Any]] = {k: [r.get(k) for r in rows] for k in EVENT_COLUMNS}
    columns["detail"] = [None if d is None else json.dumps(d) for d in columns["detail"]]
    conn.execute(EVENTS_UNNEST_PG, columns)


_ASSIGN_SQL = text(
    """
    UPDATE events SET seq = :base + s.rn
    FROM (SELECT id, row_number() OVER (ORDER BY id) AS rn
          FROM events WHERE seq IS NULL ORDER BY id LIMIT :batch) AS s
    WHERE events.id = s.id
    """
)


def assign_cursors(engine: Engine) -> int:
    """Give committed events their cursor (``seq``) in commit order; returns how many were numbered."""
    total = 0
    while True:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": EVENT_SEQUENCER_LOCK})
            base = conn.execute(select(func.coalesce(func.max(Event.seq), 0))).scalar_one()
            n = conn.execute(_ASSIGN_SQL, {"base": base, "batch": MAX_BATCH}).rowcount
        total += n
        if n < MAX_BATCH:
            return total


@dataclass(frozen=True)
class EventRecord:
    cursor: int
    job: int | None
    item: int | None
    photo: int | None
    lane: str | None
    type: str
    attempt: int | None
    token: int | None
    worker: str | None
    at: float
    detail: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "job": self.job,
            "item": self.item,
            "photo": self.photo,
            "lane": self.lane,
            "type": self.type,
            "attempt": self.attempt,
            "token": self.token,
            "worker": self.worker,
            "at": self.at,
            "detail": self.detail,
        }


def read_events(
    engine: Engine, *, after: int = 0, job_id: int | None = None, limit: int = 1000, sequence: bool = True
) -> list[EventRecord]:
    """Events with cursor > ``after`` in cursor order (numbering any committed ones first)."""
    if sequence:
        assign_cursors(engine)
    query = select(Event).where(Event.seq.is_not(None), Event.seq > after).order_by(Event.seq).limit(limit)
    if job_id is not None:
        query = query.where(Event.job_id == job_id)
    with Session(reader(engine)) as session:
        rows: Iterable[Event] = session.execute(query).scalars().all()
        return [record_of(e) for e in rows]


def record_of(e: Event) -> EventRecord:
    """An event row as readers see it (its cursor is the commit-ordered ``seq``)."""
    return EventRecord(
        cursor=int(e.seq or 0),
        job=e.job_id,
        item=e.item_id,
        photo=e.photo_id,
        lane=e.lane,
        type=e.type,
        attempt=e.attempt,
        token=e.token,
        worker=e.worker,
        at=e.at,
        detail=e.detail,
    )
