"""The dispatcher: keeps at most a lane's bound of messages in Redis; the rest wait as ``pending``.

``take_for_dispatch`` moves ready items to ``queued`` (fairly across jobs) and returns what to
publish *after* the transaction commits. If the publisher dies between commit and publish, the
sweeper finds the ``queued`` item whose message Redis does not hold and publishes it again.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any

from sqlalchemy import Connection, Engine, Select, select, text, update
from sqlalchemy.orm import Session

from store.lanes import LaneSpec

from .clock import db_now
from .engine import reader
from .events import emit_many
from .models import PENDING, QUEUED, Item, Job
from .statements import (
    JOB_DISPATCHABLE,
    event_sql,
    mark_queued_sql,
    next_pending_job_sql,
    pending_of_job_sql,
    queued_count_sql,
)

DISPATCH_LOCK_BASE = 0x64697370000  # "disp" + lane index


@dataclass(frozen=True)
class Publish:
    item_id: int
    token: int
    lane: str
    age: float = 0.0  # seconds since it was queued (for stale ones)

    @property
    def message_id(self) -> str:
        """Deterministic: the same (item, token) is one message, so Redis can be asked if it holds it."""
        return f"pj-{self.item_id}-{self.token}"


def _lane_lock(conn: Connection, lane: str) -> bool:
    if conn.dialect.name != "postgresql":
        return True  # SQLite: BEGIN IMMEDIATE already serializes
    key = DISPATCH_LOCK_BASE + zlib.crc32(lane.encode())
    return bool(conn.execute(_TRY_LANE_LOCK, {"k": key}).scalar_one())


_TRY_LANE_LOCK = text("SELECT pg_try_advisory_xact_lock(:k)")


# Per lane, the last job served first by this process's dispatcher: the next call starts after it,
# so with more jobs than room every job gets its turn (round-robin across calls).
_last_first_job: dict[str, int] = {}
JOB_SCAN_EXTRA = 64  # jobs passed over (paused, cancelled, submitting) before a call gives up looking


def _jobs_with_pending(conn: Connection, lane: str, want: int) -> list[int]:
    """Up to ``want`` dispatchable job ids with pending items, starting after the last one served,
    wrapping around. Each step is an index seek, so the cost follows the jobs looked at, not the
    number of pending items (a ``DISTINCT job_id`` over them read every one)."""
    start = _last_first_job.get(lane, 0)
    next_job = next_pending_job_sql(conn.dialect.name)
    found: list[int] = []
    after, wrapped, looked = start, False, 0
    while len(found) < want and looked < want + JOB_SCAN_EXTRA:
        row = conn.execute(next_job, {"lane": lane, "after": after}).first()
        job_id = row.job_id if row is not None and row.lane == lane and row.state == PENDING else None
        if job_id is None:
            if wrapped or start == 0:
                break
            wrapped, after = True, 0  # from the lowest job again, up to where this call started
            continue
        if wrapped and job_id > start:
            break
        looked += 1
        after = job_id
        job = conn.execute(JOB_DISPATCHABLE, {"job_id": job_id}).one()
        if job.control is None and not job.submitting:
            found.append(job_id)
    return found


def take_for_dispatch(engine: Engine, spec: LaneSpec, *, bound: int | None = None) -> list[Publish]:
    """Move up to (bound - queued) ready items of the lane to ``queued``; round-robin over jobs.

    Jobs that are paused, cancelled or still being submitted are passed over. The statements are
    the prebuilt ones of ``store.statements`` (no expression building per call).
    """
    bound = spec.effective_bound if bound is None else bound
    lane = spec.name
    with engine.begin() as conn:
        dialect = conn.dialect.name
        if not _lane_lock(conn, lane):
            return []  # another dispatcher of this lane is at work right now
        room = bound - conn.execute(queued_count_sql(dialect), {"lane": lane}).scalar_one()
        if room <= 0:
            return []
        job_ids = _jobs_with_pending(conn, lane, room)
        if not job_ids:
            return []
        _last_first_job[lane] = job_ids[0]
        ready = pending_of_job_sql(dialect)
        per_job = [conn.execute(ready, {"lane": lane, "job_id": j, "limit": room}).all() for j in job_ids]
        picked = [r for group in zip_longest(*per_job) for r in group if r is not None][:room]
        if not picked:
            return []
        queued_ids = set(conn.execute(mark_queued_sql(dialect), {"ids": [r.id for r in picked]}).scalars())
        picked = [r for r in picked if r.id in queued_ids]  # a concurrent pause/cancel took the others
        if picked:
            conn.execute(
                event_sql(dialect),
                [
                    {
                        "type": "item_queued",
                        "job_id": r.job_id,
                        "item_id": r.id,
                        "photo_id": r.photo_id,
                        "lane": lane,
                        "attempt": None,
                        "token": r.fencing_token,
                        "worker": None,
                        "detail": None,
                    }
                    for r in picked
                ],
            )
    return [Publish(r.id, r.fencing_token, lane) for r in picked]


def stale_queued_query(older_than: float, limit: int) -> Select[Any]:
    """The sweeper's look for lost messages: the queued range of ``ix_items_lease`` (state, …);
    queued items are at most the lanes' bounds, however many are pending."""
    return (
        select(Item.id, Item.fencing_token, Item.lane, (db_now() - Item.queued_at).label("age"))
        .where(Item.state == QUEUED, Item.queued_at < db_now() - older_than)
        .order_by(Item.queued_at)
        .limit(limit)
    )


def stale_queued(engine: Engine, older_than: float, limit: int = 1000) -> list[Publish]:
    """``queued`` items whose message was published more than ``older_than`` seconds ago."""
    with Session(reader(engine)) as s:
        rows = s.execute(stale_queued_query(older_than, limit)).all()
    return [Publish(r.id, r.fencing_token, r.lane, float(r.age)) for r in rows]


def mark_republished(engine: Engine, items: list[Publish], reason: str) -> list[Publish]:
    """Refresh ``queued_at`` of the items still queued with the same token; returns those to publish.

    Lock order job -> item, as cancel/pause and the revocation take them: the items' jobs are
    share-locked first (in id order), then the items are updated in id order. (Updating items in
    the order they were found, without their jobs, deadlocked with a cancel on PostgreSQL.)"""
    if not items:
        return []
    by_id = {p.item_id: p for p in items}
    out: list[Publish] = []
    with Session(engine) as s, s.begin():
        job_ids = sorted(set(s.execute(select(Item.job_id).where(Item.id.in_(list(by_id)))).scalars()))
        s.execute(select(Job.id).where(Job.id.in_(job_ids)).order_by(Job.id).with_for_update(read=True)).all()
        for item_id in sorted(by_id):
            p = by_id[item_id]
            row = s.execute(
                update(Item)
                .where(Item.id == p.item_id, Item.fencing_token == p.token, Item.state == QUEUED)
                .values(queued_at=db_now())
                .returning(Item.job_id, Item.photo_id)
            ).first()
            if row is None:
                continue
            out.append(p)
            emit_many(
                s,
                [
                    {
                        "type": "item_republished",
                        "job_id": row.job_id,
                        "item_id": p.item_id,
                        "photo_id": row.photo_id,
                        "lane": p.lane,
                        "token": p.token,
                        "detail": {"reason": reason},
                    }
                ],
            )
    return out
