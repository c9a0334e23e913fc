"""``job_finished`` (issue 38, ``store.job_end``): written in the transaction that settles a job's
last item, once per finish, on every path that finishes a job — the last item succeeded or failed,
a cancel, a stop, a revoked lease, a submission that ended with nothing to run, a retry that
re-finishes — on SQLite and PostgreSQL, driven through the store's own operations (no workers)."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy import event as sa_event
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.claims import claim_chained, lane_lock_request
from store.control import ControlRefused, cancel
from store.dispatch import take_for_dispatch
from store.events import read_events
from store.fencing import fenced
from store.lanes import EXCLUSIVE, LaneSpec, lane_spec
from store.leases import Lease
from store.models import Event, Item, JobEnd
from store.retry import retry
from store.submission import _create_job, end_submission
from store.sweeper import revoke_expired
from tests.support import expire_running_leases

pytestmark = pytest.mark.timeout(120)

NOOP = lane_spec("noop", env={})
ONCE = lane_spec("noop", env={"PHOTOJOBS_MAX_ATTEMPTS": "1"})


def submit(engine: Engine, tmp_path: Path, n: int, lanes: list[LaneSpec] | None = None) -> int:
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(n)]
    return store_jobs.submit(engine, lanes or [NOOP], photos).job_id


def claim_all(engine: Engine, spec: LaneSpec = NOOP) -> list[Lease]:
    out = []
    for p in take_for_dispatch(engine, spec):
        lease = store_items.claim(engine, spec, p.item_id, p.token, "w").lease
        assert lease is not None
        out.append(lease)
    return out


def succeed(engine: Engine, lease: Lease) -> None:
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        store_items.succeed(s, lease, None, "w")


def finished(engine: Engine, job: int) -> list[dict[str, Any]]:
    """The job's job_finished events' details, in order."""
    return [e.detail or {} for e in read_events(engine, job_id=job) if e.type == "job_finished"]


def test_the_last_success_writes_job_finished_once_in_its_transaction(engine: Engine, tmp_path: Path) -> None:
    """Given a job of three items, all claimed
    When they succeed one after another
    Then no job_finished follows the first two, and one follows the third, right after its success
    (the same transaction: nothing between them), with the state and the counts."""
    job = submit(engine, tmp_path, 3)
    leases = claim_all(engine)
    for lease in leases[:2]:
        succeed(engine, lease)
    assert finished(engine, job) == []
    succeed(engine, leases[2])
    assert finished(engine, job) == [{"state": "succeeded", "counts": {"succeeded": 3}}]
    last_two = [e.type for e in read_events(engine, job_id=job)][-2:]
    assert last_two == ["item_succeeded", "job_finished"]
    with Session(engine) as s:
        assert s.execute(select(JobEnd.state).where(JobEnd.job_id == job)).scalar_one() == "succeeded"


def test_a_final_failure_finishes_the_job_with_its_skipped_successors(engine: Engine, tmp_path: Path) -> None:
    """Given a two-lane job of one photo whose first item is claimed
    When it fails for good (its next lane's item is skipped)
    Then job_finished says failed, with one failed and one skipped item."""
    analysis = lane_spec("analysis", env={})
    job = submit(engine, tmp_path, 1, [analysis, NOOP])  # noop needs every lane before it
    (lease,) = claim_all(engine, analysis)
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        store_items.fail(s, analysis, lease, "boom", "w", retry=False)
    assert finished(engine, job) == [{"state": "failed", "counts": {"failed": 1, "skipped": 1}}]


def test_a_cancel_finishes_at_once_or_when_its_running_items_stop(engine: Engine, tmp_path: Path) -> None:
    """Given two jobs: one with nothing running, one with an item running
    When both are cancelled, and the running item then stops cooperatively
    Then the first gets job_finished (cancelled) in the cancel's own transaction, the second only
    when its running item stops."""
    idle = submit(engine, tmp_path / "a", 2)
    cancel(engine, idle)
    assert finished(engine, idle) == [{"state": "cancelled", "counts": {"cancelled": 2}}]
    assert [e.type for e in read_events(engine, job_id=idle)][-2:] == ["job_cancel_requested", "job_finished"]
    busy = submit(engine, tmp_path / "b", 2)
    leases = claim_all(engine)
    cancel(engine, busy)
    assert finished(engine, busy) == []
    for lease in leases:
        with fenced(engine, lease.item_id, lease.token, worker="w") as s:
            store_items.stop(s, lease, "w", "cancel requested")
    assert finished(engine, busy) == [{"state": "cancelled", "counts": {"cancelled": 2}}]
    with pytest.raises(ControlRefused):  # a cancel of a finished job is refused (store.control)
        cancel(engine, busy)
    assert len(finished(engine, busy)) == 1  # and finishes nothing again


def test_a_failure_with_attempts_left_on_a_cancelled_job_finishes_it(engine: Engine, tmp_path: Path) -> None:
    """Given a job whose two items are running, cancelled meanwhile (found by the photo chaos run:
    a noop job cancelled while an item matching ``noop.fail_if`` ran ended without job_finished)
    When one stops cooperatively and the other fails with attempts left (its retry is cancelled)
    Then the job is finished, cancelled, once: a retry that ends an item counts as its end."""
    job = submit(engine, tmp_path, 2)
    first, second = claim_all(engine)
    cancel(engine, job)
    with fenced(engine, first.item_id, first.token, worker="w") as s:
        store_items.stop(s, first, "w", "cancel requested")
    assert finished(engine, job) == []
    with fenced(engine, second.item_id, second.token, worker="w") as s:
        assert store_items.fail(s, NOOP, second, "boom", "w") == "cancelled"
    assert finished(engine, job) == [{"state": "cancelled", "counts": {"cancelled": 2}}]


def test_a_retry_re_finishes_the_job_once_more(engine: Engine, tmp_path: Path) -> None:
    """Given a job finished as failed
    When its failed item is retried and then succeeds
    Then a second job_finished (succeeded) is written, one per finish."""
    job = submit(engine, tmp_path, 1)
    (lease,) = claim_all(engine)
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        store_items.fail(s, NOOP, lease, "boom", "w", retry=False)
    assert [d["state"] for d in finished(engine, job)] == ["failed"]
    retry(engine, job)
    with Session(engine) as s:
        assert s.get(JobEnd, job) is None  # reopened
    (again,) = claim_all(engine)
    succeed(engine, again)
    assert [d["state"] for d in finished(engine, job)] == ["failed", "succeeded"]


def test_a_lease_revoked_into_failed_finishes_the_job(engine: Engine, tmp_path: Path) -> None:
    """Given a job of one item with a single attempt, claimed by a worker that died
    When the sweeper revokes the expired lease (quarantine: failed)
    Then the sweeper's transaction writes job_finished (failed)."""
    job = submit(engine, tmp_path, 1, [ONCE])
    claim_all(engine, ONCE)
    expire_running_leases(engine)
    assert revoke_expired(engine, {"noop": ONCE}) == (1, 1)
    assert finished(engine, job) == [{"state": "failed", "counts": {"failed": 1}}]


def test_a_submission_that_ended_with_no_items_finishes_its_job(engine: Engine) -> None:
    """Given a job whose submission created it but landed no photo (its submitter failed)
    When the submission is ended (cancelled)
    Then the job, with no items, gets job_finished (cancelled) once."""
    job, _ = _create_job(engine, [NOOP], [store_jobs.PhotoInput("/p.jpg")], {}, [], "fp", set(), None, None,
                         engine.dialect.name == "postgresql")  # fmt: skip
    assert end_submission(engine, job, "test")
    assert finished(engine, job) == [{"state": "cancelled", "counts": {}}]


def test_two_last_items_finishing_at_once_write_one_job_finished(engine: Engine, tmp_path: Path) -> None:
    """Given a job of two claimed items
    When both succeed in two transactions at once (on PostgreSQL both items are written before
    either commits, and each transaction's job-end check waits up to 2 s for the other's: without
    the job's end lock both would read the other's item still running)
    Then exactly one job_finished is written, after both successes."""
    job = submit(engine, tmp_path, 2)
    leases = claim_all(engine)
    concurrent = engine.dialect.name == "postgresql"  # SQLite serializes the two transactions
    both_written = threading.Barrier(2, timeout=30)
    both_checking = threading.Barrier(2)
    errors: list[BaseException] = []

    def at_check(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "AS active" in statement:  # store.job_end's check: meet the other one there if it can come
            try:
                both_checking.wait(timeout=2)
            except threading.BrokenBarrierError:
                pass  # it cannot: it waits for this transaction's end lock

    def finish(lease: Lease) -> None:
        try:
            with fenced(engine, lease.item_id, lease.token, worker="w") as s:
                store_items.succeed(s, lease, None, "w")
                if concurrent:
                    both_written.wait()
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    if concurrent:
        sa_event.listen(engine, "before_cursor_execute", at_check)
    try:
        threads = [threading.Thread(target=finish, args=(lease,)) for lease in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        if concurrent:
            sa_event.remove(engine, "before_cursor_execute", at_check)
    assert errors == []
    assert finished(engine, job) == [{"state": "succeeded", "counts": {"succeeded": 2}}]
    with Session(engine) as s:
        types = list(s.execute(select(Event.type).where(Event.job_id == job).order_by(Event.seq)).scalars())
        states = set(s.execute(select(Item.state).where(Item.job_id == job)).scalars())
    assert types[-1] == "job_finished" and states == {"succeeded"}


def test_a_success_whose_chained_claim_is_refused_still_finishes_its_job(
    engine: Engine, tmp_path: Path
) -> None:
    """Given job A of one claimed item, and job B's queued item on a photo that job C holds locked
    When A's item succeeds in a transaction that also tries the chained claim of B's item (a worker
    thread's next message) and that claim is refused inside its savepoint (the photo is locked)
    Then A still gets its job_finished: the savepoint's rollback does not forget that the enclosing
    transaction ended A's last item (seen in the photo chaos run: a watched folder's one-photo job
    never finished)."""
    locking = replace(NOOP, lock=EXCLUSIVE)
    a = submit(engine, tmp_path / "a", 1)
    (lease,) = claim_all(engine)
    photo = [store_jobs.PhotoInput(str(tmp_path / "shared.jpg"), 1)]
    store_jobs.submit(engine, [locking], photo)  # job C ...
    (holder,) = claim_all(engine, locking)  # ... holds the photo
    b = store_jobs.submit(engine, [locking], photo).job_id
    (queued,) = take_for_dispatch(engine, locking)
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        store_items.succeed(s, lease, None, "w")
        chained = claim_chained(s, locking, queued.item_id, queued.token, "w", lane_lock_request(locking))
    assert chained is None  # refused: the photo is C's
    assert holder.photo_ids
    assert finished(engine, a) == [{"state": "succeeded", "counts": {"succeeded": 1}}]
    assert finished(engine, b) == []
