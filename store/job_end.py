"""``job_finished``: written once per finish, in the transaction that settles the job's last item.

A job has no state column: its state follows from its items (``store.status.derive_job_state``).
It is *finished* when no item is waiting, pending, queued, running or paused and it is not still
being submitted (a cancelled submission is over). Every transaction that may end a job's last item
— a success or final failure (``store.finishing``), a cooperative stop as cancelled, a cancel
(``store.control``), a lease revoked into failed/cancelled (``store.sweeper``), a claim that failed
for good (``store.claim_refusals``), a submission that completes or ends (``store.submission``) —
says so with :func:`touched`; the one place that decides and writes the event is :func:`_settle`,
run by the session's ``before_commit``, after every other write of the transaction:

1. on PostgreSQL, ``pg_advisory_xact_lock(JOB_END_LOCK, job)`` for each touched job in ascending
   id. Two transactions ending a job's last two items at once would each see the other's item
   still running (READ COMMITTED) and neither would write the event; under the lock the second one
   reads after the first committed, and sees every item ended. The lock is taken last in its
   transaction, and its holder only reads, inserts and commits: it waits for no row lock, so it
   closes no wait-for cycle (SQLite serializes writers anyway);
2. one statement per batch of jobs: the job's submission, control, whether ``job_ends`` has it, and
   whether any item is unfinished (an ``EXISTS`` served by ``ix_items_job_state`` per lane);
3. a finished job not in ``job_ends`` gets its counts by state, its derived state, a ``job_ends``
   row and the ``job_finished`` event ``{"state", "counts"}``.

``job_ends`` makes it once per finish; a retry that brings items back (``store.retry``) calls
:func:`reopen` (the same lock, then the row deleted), so the job's next finish writes it again.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from sqlalchemy import delete, event, func, insert, select, text
from sqlalchemy.orm import Session, SessionTransaction

from .clock import db_now
from .events import emit_many
from .fencing import FencedSession, lock_fence
from .models import ALL_STATES, CANCEL, TERMINAL, Item, JobEnd
from .status import derive_job_state

JOB_END_LOCK = 0x6A656E64  # "jend": pg_advisory_xact_lock(JOB_END_LOCK, job id)
TOUCHED = "jobs_touched"  # session.info: the jobs whose items this transaction ended
UNFINISHED = tuple(s for s in ALL_STATES if s not in TERMINAL)

_CHECK = {
    "postgresql": text(
        """
        SELECT j.id, j.submitting, j.control,
               EXISTS (SELECT 1 FROM job_ends e WHERE e.job_id = j.id) AS ended,
               EXISTS (SELECT 1 FROM items i
                       WHERE i.job_id = j.id
                         AND i.lane IN (SELECT json_array_elements_text(j.lanes))
                         AND i.state IN ('waiting', 'pending', 'queued', 'running', 'paused')) AS active
        FROM jobs j WHERE j.id = ANY(:ids)
        """
    ),
    "sqlite": text(
        """
        SELECT j.id, j.submitting, j.control,
               EXISTS (SELECT 1 FROM job_ends e WHERE e.job_id = j.id) AS ended,
               EXISTS (SELECT 1 FROM items i
                       WHERE i.job_id = j.id
                         AND i.lane IN (SELECT value FROM json_each(j.lanes))
                         AND i.state IN ('waiting', 'pending', 'queued', 'running', 'paused')) AS active
        FROM jobs j WHERE j.id IN (SELECT value FROM json_each(:ids))
        """
    ),
}


def touched(s: Session, job_ids: int | Iterable[int]) -> None:
    """This transaction may have ended the last unfinished item of ``job_ids``: its commit checks
    them (:func:`_settle`) and writes ``job_finished`` for each one that is finished now."""
    ids = {job_ids} if isinstance(job_ids, int) else set(job_ids)
    if ids:
        s.info.setdefault(TOUCHED, set()).update(ids)


def _lock(s: Session, job_ids: Iterable[int]) -> None:
    if s.get_bind().dialect.name == "postgresql":
        for job_id in sorted(job_ids):
            s.execute(text("SELECT pg_advisory_xact_lock(:k, :j)"), {"k": JOB_END_LOCK, "j": job_id})


def reopen(s: Session, job_id: int) -> None:
    """A retry brought items of the job back (the caller holds the job's row lock): its next finish
    writes ``job_finished`` again. Under the job's end lock, so a finish deciding concurrently
    either committed first (its row is deleted here) or decides after this commits (and sees the
    retried items unfinished)."""
    _lock(s, [job_id])
    s.execute(delete(JobEnd).where(JobEnd.job_id == job_id))


@event.listens_for(Session, "before_commit")
def _before_commit(s: Session) -> None:
    ids = s.info.pop(TOUCHED, None)
    if ids:
        _settle(s, sorted(ids))


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(s: Session, transaction: SessionTransaction) -> None:
    # Only the outermost transaction's end forgets the touched jobs. ``after_rollback`` also fires
    # for a savepoint's rollback (``begin_nested``: a chained claim refused inside a success's
    # transaction), which must not drop the jobs the enclosing transaction ended; a job touched
    # only inside a rolled-back savepoint is checked anyway, and found unfinished (harmless).
    if transaction.parent is None and not transaction.nested:
        s.info.pop(TOUCHED, None)


def _settle(s: Session, job_ids: list[int]) -> None:
    """Write ``job_finished`` for each of ``job_ids`` that this transaction finished (module doc)."""
    if isinstance(s, FencedSession):
        lock_fence(s)  # the item's row lock before the end lock (the fence is usually checked)
    _lock(s, job_ids)
    conn = s.connection()
    dialect = conn.dialect.name
    ids: Any = job_ids if dialect == "postgresql" else json.dumps(job_ids)
    finished = [
        r
        for r in conn.execute(_CHECK[dialect], {"ids": ids})
        if not r.ended and not r.active and not (r.submitting and r.control != CANCEL)
    ]
    if not finished:
        return
    events: list[dict[str, Any]] = []
    for r in sorted(finished, key=lambda r: r.id):
        counts = {
            state: n
            for state, n in s.execute(
                select(Item.state, func.count()).where(Item.job_id == r.id).group_by(Item.state)
            )
        }
        state = derive_job_state(r.control, counts, bool(r.submitting))
        s.execute(insert(JobEnd).values(job_id=r.id, state=state, finished_at=db_now()))
        detail = {"state": state, "counts": dict(sorted(counts.items()))}
        events.append({"type": "job_finished", "job_id": r.id, "detail": detail})
    emit_many(s, events)
