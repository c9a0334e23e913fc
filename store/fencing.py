"""Fenced sessions: every write a running item makes commits only while its lease still holds.

At the commit boundary (SQLAlchemy ``before_commit``) the session re-reads the item under a row
lock (``SELECT … FOR UPDATE`` on PostgreSQL; SQLite already holds the write lock from
``BEGIN IMMEDIATE``) and raises ``StaleLease`` unless the item is still ``running`` with the
session's fencing token. The transaction then rolls back whole; ``fenced`` records a
``stale_commit_rejected`` event in a transaction of its own and re-raises.

A finishing transaction checks the fence in its own compare-and-set instead (``store.items``:
``UPDATE … WHERE id, token, state = 'running' RETURNING id``): a matched row is the same check
under the same row lock, held until the commit, so it marks the session ``fence_verified`` and
the commit-boundary read is skipped; no row raises ``StaleLease`` right there. A fenced session
that writes other rows without finishing (an intent, a photo) checks the fence first
(``lock_fence``), so the item is its first row lock, as the global lock order asks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from .errors import StaleLease
from .events import emit, insert_events
from .models import RUNNING, Item

# session.info key: the event rows of a batch finish, inserted together before its commit
DEFERRED_EVENTS = "deferred_events"
#: a batch finish's writes that one statement does for all its items (``defer_write``)
DEFERRED_WRITES = "deferred_writes"


class FencedSession(Session):
    """A session bound to one lease: (item id, fencing token)."""

    def __init__(self, bind: Engine, item_id: int, token: int, **kw: object) -> None:
        super().__init__(bind=bind, expire_on_commit=False, **kw)  # type: ignore[arg-type]
        self.fence_item_id = item_id
        self.fence_token = token


def lock_fence(session: Session) -> None:
    """In a fenced session, check the fence now, under the item's row lock, which the transaction
    then holds until its commit (so the commit-boundary check is skipped): raises ``StaleLease``
    unless the lease still holds. Called before a fenced session writes any row but its item's —
    a photo, an intent, photo-lock rows — so its first lock is the item's (the global order job
    -> item -> photo -> intent -> photo-lock rows); a fence checked only at the commit would lock
    the item after those rows. Nothing to do (no statement) once the fence is checked, e.g. by the
    session's finishing compare-and-set, or outside a fenced session."""
    if not isinstance(session, FencedSession) or session.info.get("fence_verified"):
        return
    _verify(session)
    session.info["fence_verified"] = True


@event.listens_for(FencedSession, "before_commit")
def _check_fence(session: FencedSession) -> None:
    if session.info.get("fence_verified"):
        # The session's finishing UPDATE (or ``lock_fence``) matched (item, token, running) and
        # holds the row (the write lock on SQLite) until this commit: the fence is already checked.
        return
    _verify(session)


def _verify(session: FencedSession) -> None:
    """The fence check under the item's row lock: ``StaleLease`` unless the lease still holds."""
    row = session.execute(
        select(Item.state, Item.fencing_token).where(Item.id == session.fence_item_id).with_for_update()
    ).first()
    # The token moves on with every claim and every revocation, so an equal token means nobody else
    # touched the lease; the state may differ from running only if this very session ended it.
    ended_here = session.info.get("ended_lease", False)
    if row is None or row.fencing_token != session.fence_token or (row.state != RUNNING and not ended_here):
        raise StaleLease(
            session.fence_item_id,
            session.fence_token,
            row.state if row else None,
            row.fencing_token if row else None,
        )


class BatchFinishSession(Session):
    """One transaction that finishes several items (a batch message's): every item's writes start
    with its own finishing compare-and-set, the fence (``store.items``), which records the item in
    ``info["fenced_items"]``. At the commit boundary every item the session was opened for must
    have been fenced so, or nothing commits."""

    def __init__(self, bind: Engine, item_ids: Iterable[int], **kw: object) -> None:
        super().__init__(bind=bind, expire_on_commit=False, **kw)  # type: ignore[arg-type]
        self.fence_items = set(item_ids)


class UnfencedWrite(RuntimeError):
    """A batch finish was about to commit an item's writes without that item's fence."""


@event.listens_for(BatchFinishSession, "before_commit")
def _check_batch_fence(session: BatchFinishSession) -> None:
    missing = session.fence_items - session.info.get("fenced_items", set())
    if missing:
        raise UnfencedWrite(f"items {sorted(missing)} were finished without their fence")


def defer_write(s: Session, key: str, rank: int, flush: Callable[[Session], None]) -> bool:
    """In a batch finish (``fenced_batch``): have ``flush(s)`` run once, before the commit, after
    every item's own writes and in ``rank`` order with the other deferred writes (the lock order:
    photos before photo-lock rows); True then, and the caller leaves its row for ``flush`` to write
    with the other items'. False in any other session: the caller writes now."""
    writes = s.info.get(DEFERRED_WRITES)
    if writes is None:
        return False
    writes.setdefault(key, (rank, flush))
    return True


@contextmanager
def fenced_batch(engine: Engine, item_ids: Iterable[int]) -> Iterator[BatchFinishSession]:
    """A transaction finishing ``item_ids`` together; it raises ``StaleLease`` (rolled back, nothing
    recorded: the caller finishes each item on its own, which records the refusal) when any of
    their leases no longer holds."""
    session = BatchFinishSession(engine, item_ids)
    session.info[DEFERRED_EVENTS] = events = []
    session.info[DEFERRED_WRITES] = writes = {}
    try:
        with session.begin():
            yield session
            # the items' writes that go together (in the order of their ranks), then their event
            # rows in one statement, in the same transaction
            for _, flush in sorted(writes.values(), key=lambda w: w[0]):
                flush(session)
            insert_events(session.connection(), events)
    finally:
        session.close()


@contextmanager
def fenced(
    engine: Engine, item_id: int, token: int, *, worker: str | None = None, what: str = "commit"
) -> Iterator[FencedSession]:
    """A transaction that commits only if the lease (item_id, token) still holds."""
    session = FencedSession(engine, item_id, token)
    try:
        with session.begin():
            yield session
    except StaleLease as exc:
        session.rollback()
        record_stale_commit(engine, exc, worker=worker, what=what)
        raise
    finally:
        session.close()


def record_stale_commit(engine: Engine, exc: StaleLease, *, worker: str | None, what: str) -> None:
    with Session(engine) as s, s.begin():
        item = s.get(Item, exc.item_id)
        emit(
            s,
            "stale_commit_rejected",
            job_id=item.job_id if item else None,
            item_id=exc.item_id,
            photo_id=item.photo_id if item else None,
            lane=item.lane if item else None,
            attempt=item.attempt if item else None,
            token=exc.token,
            worker=worker,
            detail={"what": what, "current_state": exc.current_state, "current_token": exc.current_token},
        )
