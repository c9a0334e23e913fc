"""Prune racing a retry and the sweeper's orphan settling: no deadlock, no lost retry, no event of a
pruned job (issue 22). The interleavings are forced with statement hooks (``after_cursor_execute``)
that hold one transaction at a chosen statement until the other has run or waits for a lock."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, insert, select, update
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store.engine import make_engine
from store.errors import UnknownJob
from store.intents import RECORDED, settle_orphans
from store.lanes import all_lanes
from store.models import Event, Intent, Item, Job, PhotoLock
from store.retention import prune
from store.retry import retry
from tests.support import wait_for, waiting_for_a_lock

RETRY_EVENTS = ("item_retried", "job_retried")


def _finished_job(engine: Engine, tmp: Path, n: int = 3) -> int:
    """A one-lane job whose items all failed, with a newer job after it (the newest job is never pruned)."""
    spec = all_lanes({})["analysis"]
    job = store_jobs.submit(engine, [spec], [store_jobs.PhotoInput(str(tmp / f"p{i}.jpg")) for i in range(n)])
    store_jobs.submit(engine, [spec], [store_jobs.PhotoInput(str(tmp / "newest.jpg"))])
    with Session(engine) as s, s.begin():
        failed = update(Item).where(Item.job_id == job.job_id)
        s.execute(failed.values(state="failed", error="boom", attempt=3))
    return job.job_id


def _record_orphan_intent(engine: Engine, job: int, tmp: Path) -> int:
    """A recorded intent (and the photo lock it holds) left by one of the job's failed items: a
    publish whose staged file is gone, so the sweeper settles it as not applied."""
    with Session(engine) as s, s.begin():
        item = s.execute(select(Item).where(Item.job_id == job).order_by(Item.id).limit(1)).scalar_one()
        intent = s.execute(
            insert(Intent)
            .values(
                item_id=item.id,
                token=item.fencing_token,
                photo_id=item.photo_id,
                kind="publish",
                staged=str(tmp / ".out.jpg.pj-t1.tmp"),
                target=str(tmp / "out.jpg"),
                source=None,
                base_sha256=None,
                result_sha256="0" * 64,
                state=RECORDED,
                created_at=0.0,
            )
            .returning(Intent.id)
        ).scalar_one()
        s.execute(
            insert(PhotoLock).values(
                photo_id=item.photo_id, item_id=item.id, mode="X", token=item.fencing_token, intent_id=intent
            )
        )
    return intent


def _job_exists(engine: Engine, job: int) -> bool:
    with Session(engine) as s:
        return s.get(Job, job) is not None


def _events_of_missing_jobs(engine: Engine) -> list[tuple[str, int | None]]:
    """Events (numbered or not) naming a job that is no longer in the store."""
    with Session(engine) as s:
        rows = s.execute(
            select(Event.type, Event.job_id).where(
                Event.job_id.is_not(None), Event.job_id.not_in(select(Job.id))
            )
        ).all()
    return [(r.type, r.job_id) for r in rows]


class Other:
    """The competing operation, run in a thread: its result or its error."""

    def __init__(self, action: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.began = threading.Event()  # it has started (SQLite: it then waits for the write lock)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.action = action

    def _run(self) -> None:
        self.began.set()
        try:
            self.result = self.action()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def done(self) -> bool:
        return not self.thread.is_alive()


@contextmanager
def held_at(engine: Engine, marker: str, meanwhile: Callable[[], None]) -> Iterator[list[str]]:
    """The first statement on ``engine`` containing ``marker`` runs, then its thread calls
    ``meanwhile`` (which runs the other side) before it goes on. Yields the statements seen."""
    seen: list[str] = []
    fired = threading.Event()

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(statement)
        if marker in statement and not fired.is_set():
            fired.set()
            meanwhile()

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        event.remove(engine, "after_cursor_execute", after)
    assert fired.is_set(), f"the statement {marker!r} never ran: {seen}"


def _start_and_wait(other: Other, admin: Engine) -> None:
    """Start ``other`` and wait until it has finished, waits for a row lock (PostgreSQL) or has
    started (SQLite: the holder's write lock makes it wait at its BEGIN IMMEDIATE, for whatever
    part of its life overlaps the holder's)."""
    other.thread.start()
    if admin.dialect.name == "postgresql":
        wait_for(lambda: other.done() or waiting_for_a_lock(admin), 30, what="the other side to end or wait")
    else:
        wait_for(lambda: other.done() or other.began.is_set(), 30, what="the other side to begin")


def test_a_retry_that_commits_after_prunes_first_look_keeps_its_job(db_url: str, tmp_path: Path) -> None:
    """Given a finished job, prune has read it as finished (its candidate query ran); when a retry
    of the job runs right then, the retry's items are never pruned from under it: on PostgreSQL the
    retry commits and prune, deciding again under the job's lock, keeps the job; on SQLite prune's
    write transaction makes the retry wait, and it then finds no job. Never an event of a pruned job."""
    engine, pruner, retrier = make_engine(db_url), make_engine(db_url), make_engine(db_url)
    try:
        job = _finished_job(engine, tmp_path)
        other = Other(lambda: retry(retrier, job))
        # When prune is held right after its candidate query while the retry runs
        with held_at(pruner, "max(jobs.id)", lambda: _start_and_wait(other, engine)):
            pruned = prune(pruner, 0)
        other.thread.join(60)
        # Then
        if engine.dialect.name == "postgresql":
            assert other.error is None and other.result == 3, other.error
            assert pruned.jobs == 0 and _job_exists(engine, job)
            with Session(engine) as s:
                states = set(s.execute(select(Item.state).where(Item.job_id == job)).scalars())
            assert states == {"pending"}
        else:
            assert isinstance(other.error, UnknownJob), other.error
            assert pruned.jobs == 1 and not _job_exists(engine, job)
        assert not any(t in RETRY_EVENTS for t, _ in _events_of_missing_jobs(engine))
    finally:
        for e in (engine, pruner, retrier):
            e.dispose()


def test_prune_and_a_retry_meeting_on_their_locks_do_not_deadlock(pg_url: str, tmp_path: Path) -> None:
    """PostgreSQL. Given a finished job whose items prune is deleting (its ``DELETE FROM items``
    ran, uncommitted), when a retry of the job starts and waits for a lock, prune goes on and
    commits without a deadlock and the retry finds no job (or, had it come first, kept it);
    no retry event is left for a pruned job."""
    engine, pruner, retrier = make_engine(pg_url), make_engine(pg_url), make_engine(pg_url)
    try:
        job = _finished_job(engine, tmp_path)
        other = Other(lambda: retry(retrier, job))
        # When prune is held right after it deleted the job's items, until the retry waits
        with held_at(pruner, "DELETE FROM items", lambda: _start_and_wait(other, engine)):
            pruned = prune(pruner, 0)
        other.thread.join(60)
        # Then prune won cleanly: the job is gone and the retry says so
        assert not other.thread.is_alive()
        assert isinstance(other.error, UnknownJob), repr(other.error)
        assert pruned.jobs == 1 and not _job_exists(engine, job)
        assert not any(t in RETRY_EVENTS for t, _ in _events_of_missing_jobs(engine))
    finally:
        for e in (engine, pruner, retrier):
            e.dispose()


def test_prune_and_the_sweepers_orphan_settling_do_not_deadlock(pg_url: str, tmp_path: Path) -> None:
    """PostgreSQL. Given a finished job one of whose failed items left a recorded intent, the
    sweeper's orphan settling holds that item's row (its ``FOR UPDATE SKIP LOCKED`` ran); when a
    prune runs then (and has finished or waits for a lock), the settling goes on: neither side
    deadlocks, the intent is settled, and the next prune takes the job."""
    engine, pruner, sweeper = make_engine(pg_url), make_engine(pg_url), make_engine(pg_url)
    try:
        job = _finished_job(engine, tmp_path)
        intent = _record_orphan_intent(engine, job, tmp_path)
        other = Other(lambda: prune(pruner, 0))
        # When the settling is held after locking the item, while prune runs
        with held_at(sweeper, "SKIP LOCKED", lambda: _start_and_wait(other, engine)):
            settled = settle_orphans(sweeper)
        other.thread.join(60)
        # Then no deadlock on either side; the intent was settled, not pruned from under the sweeper
        assert other.error is None, repr(other.error)
        assert settled == 1
        with Session(engine) as s:
            assert s.get(Intent, intent).state == "discarded"  # type: ignore[union-attr]
        assert other.result.jobs == 0  # type: ignore[attr-defined]
        # And once settled, the job is pruned
        assert prune(engine, 0).jobs == 1 and not _job_exists(engine, job)
    finally:
        for e in (engine, pruner, sweeper):
            e.dispose()


def test_prune_keeps_a_finished_job_until_its_intents_are_settled(engine: Engine, tmp_path: Path) -> None:
    """Given a finished job whose failed item left a recorded intent (it holds the photo's lock),
    when it is pruned, the job stays (its intent and lock are the sweeper's to settle); once the
    sweeper settled it, the next prune removes the job."""
    job = _finished_job(engine, tmp_path)
    _record_orphan_intent(engine, job, tmp_path)
    # When
    first = prune(engine, 0)
    # Then
    assert first.jobs == 0 and _job_exists(engine, job)
    with Session(engine) as s:
        assert s.execute(select(PhotoLock)).scalars().all() != []
    # And after the sweeper settled the intent
    assert settle_orphans(engine) == 1
    assert prune(engine, 0).jobs == 1 and not _job_exists(engine, job)
    with Session(engine) as s:
        assert s.execute(select(Intent)).scalars().all() == []
        assert s.execute(select(PhotoLock)).scalars().all() == []
