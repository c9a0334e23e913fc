"""Lanes paused across all jobs: stored (revision 0008), so a pause survives restarts; events record it.

A paused lane: the dispatcher publishes nothing for it (``store.dispatch.take_for_dispatch``) and a
claim of its items refuses (``store.queries.claim_sql``); the claim's second look defers such an
item back to ``pending`` (``store.items._not_claimed``), so it is dispatched again after the resume.
Items already running finish.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, select, text, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from .clock import db_now
from .engine import reader
from .events import emit
from .models import LaneControl

LANE_PAUSED = "lane_paused"
LANE_RESUMED = "lane_resumed"


def _ensure_row(s: Session, lane: str) -> None:
    insert = pg_insert if s.get_bind().dialect.name == "postgresql" else sqlite_insert
    s.execute(
        insert(LaneControl).values(lane=lane, paused_at=None, updated_at=db_now()).on_conflict_do_nothing()
    )


def pause_lane(engine: Engine, lane: str, by: str) -> bool:
    """Pause ``lane`` for every job; True when it was running (``lane_paused`` written), False when
    it was paused already. The caller checks that the lane exists."""
    with Session(engine) as s, s.begin():
        _ensure_row(s, lane)
        running = LaneControl.paused_at.is_(None)
        return _switch(s, lane, running, LANE_PAUSED, by, paused_at=db_now(), paused_by=by[:128])


def resume_lane(engine: Engine, lane: str, by: str) -> bool:
    """Resume ``lane``; True when it was paused (``lane_resumed`` written), False otherwise."""
    with Session(engine) as s, s.begin():
        paused = LaneControl.paused_at.is_not(None)
        return _switch(s, lane, paused, LANE_RESUMED, by, paused_at=None, paused_by=None)


def _switch(s: Session, lane: str, was: ColumnElement[bool], event: str, by: str, **values: Any) -> bool:
    """Set ``values`` on the lane's row if it ``was`` so; True (and ``event`` written) when it was."""
    changed = s.execute(
        update(LaneControl)
        .where(LaneControl.lane == lane, was)
        .values(**values, updated_at=db_now())
        .returning(LaneControl.lane)
    ).first()
    if changed is None:
        return False
    emit(s, event, lane=lane, detail={"by": by[:128]})
    return True


def paused_lanes(engine: Engine) -> dict[str, float]:
    """The paused lanes: lane -> database time it was paused."""
    with Session(reader(engine)) as s:
        rows = s.execute(
            select(LaneControl.lane, LaneControl.paused_at).where(LaneControl.paused_at.is_not(None))
        ).all()
    return {r.lane: float(r.paused_at) for r in rows}


_LANE_PAUSED_SQL = text("SELECT 1 FROM lane_control WHERE lane = :lane AND paused_at IS NOT NULL")


def lane_paused(conn: Connection | Session, lane: str) -> bool:
    """Whether ``lane`` is paused, read in the caller's transaction."""
    return conn.execute(_LANE_PAUSED_SQL, {"lane": lane}).first() is not None
