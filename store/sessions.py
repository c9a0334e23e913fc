"""Server-side web sessions (table ``web_sessions``, revision 0007): create, check-and-touch, revoke.

A row is keyed by the SHA-256 of the session cookie, so a copy of the table does not hand out
sessions. Times are the database clock (``store.clock.db_now``), so several server processes on
hosts with skewed clocks agree on expiry. A session is live while its row exists, ``expires_at``
(absolute) is ahead and its last request is less than ``idle`` seconds ago.
"""

from __future__ import annotations

import hashlib

from sqlalchemy import Engine, delete, or_, select, update

from .clock import db_now
from .engine import reader
from .models import WebSession


def session_key(cookie: str) -> str:
    """The stored id of a session cookie: its SHA-256, hex."""
    return hashlib.sha256(cookie.encode()).hexdigest()


def create_session(engine: Engine, cookie: str, *, idle: float, max_age: float) -> None:
    """Record a new session (and delete the sessions that have ended, so the table stays small)."""
    if idle <= 0 or max_age <= 0:
        raise ValueError(f"session idle ({idle}) and max age ({max_age}) must be positive")
    with engine.begin() as conn:
        now = conn.execute(select(db_now())).scalar_one()
        conn.execute(
            delete(WebSession).where(
                or_(WebSession.expires_at <= now, WebSession.last_seen + WebSession.idle <= now)
            )
        )
        conn.execute(
            WebSession.__table__.insert().values(
                id=session_key(cookie), created_at=now, last_seen=now, idle=idle, expires_at=now + max_age
            )
        )


def check_session(engine: Engine, cookie: str, *, touch_after: float = 60.0) -> bool:
    """True while the session of ``cookie`` is live; a live session's ``last_seen`` moves to now
    when it is older than ``touch_after`` seconds (at most one write per session per minute)."""
    key = session_key(cookie)
    with reader(engine).connect() as conn:
        row = conn.execute(
            select(WebSession.last_seen, WebSession.idle, WebSession.expires_at, db_now()).where(
                WebSession.id == key
            )
        ).one_or_none()
    if row is None:
        return False
    last_seen, idle, expires_at, now = row
    if now >= expires_at or now >= last_seen + idle:
        return False
    if now - last_seen >= min(touch_after, idle / 4):
        with engine.begin() as conn:
            conn.execute(update(WebSession).where(WebSession.id == key).values(last_seen=db_now()))
    return True


def revoke_session(engine: Engine, cookie: str) -> bool:
    """End the session of ``cookie`` now; True when it was recorded."""
    with engine.begin() as conn:
        return conn.execute(delete(WebSession).where(WebSession.id == session_key(cookie))).rowcount > 0


__all__ = ["check_session", "create_session", "revoke_session", "session_key"]
