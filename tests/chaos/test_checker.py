"""The chaos checker on hand-made histories (what it must accept and what it must report), and on a
real store (SQLite and PostgreSQL) driven through the store's own operations."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.events import assign_cursors
from store.fencing import fenced
from store.lanes import lane_spec
from store.models import Event, Item
from tests.chaos.checker import StoredLock, check, check_cursors, check_history
from tests.chaos.history import History, snapshot

W1, W2 = "host:1:aaaaaa", "host:2:bbbbbb"


def violations(h: History, states, **kw) -> list[str]:  # type: ignore[no-untyped-def]
    snap_kw = {k: kw.pop(k) for k in ("controls", "job_states", "results", "locks") if k in kw}
    return check_history(
        h.events, snapshot(h, states, **snap_kw), job_ids=set(h.jobs.values()), **kw
    ).violations


def one_of(found: list[str], *needles: str) -> None:
    assert found, f"expected a violation mentioning {needles}, the checker found none"
    assert any(all(n in v for n in needles) for v in found), f"no violation mentions {needles}: {found}"


# -- histories the checker must accept ------------------------------------------------------------


def test_accepts_a_plain_run() -> None:
    # Given two items that are queued, claimed and succeed once each
    h = History().submit(1, [10, 11]).run(10, 0, 1, W1, {"ok": 1}).run(11, 0, 1, W2).finished(1, succeeded=2)
    # When the history is checked against a store that agrees with it
    found = violations(h, {10: ("succeeded", 1, 1), 11: ("succeeded", 1, 1)}, results={10: {"ok": 1}})
    # Then there is nothing to report
    assert found == []


def test_accepts_revocation_rejected_zombie_and_a_second_run() -> None:
    # Given an item whose first lease expires (frozen worker), that runs again elsewhere, and whose
    # zombie's late commit is rejected
    h = History().submit(1, [10]).queued(10, 0).claimed(10, 1, 1, W1).expired(10, 1, 1, W1)
    h.queued(10, 2).claimed(10, 3, 2, W2).stale(10, 1, W1).succeeded(10, 3, 2, W2).finished(1, succeeded=1)
    # When it is checked
    found = violations(h, {10: ("succeeded", 3, 2)})
    # Then it is a valid history
    assert found == []


def test_accepts_pause_stop_resume_release_deferral_and_cancel() -> None:
    # Given a job paused while one item runs (its worker stops it), resumed, then an item deferred on a
    # photo lock, released at shutdown, and finally the job cancelled with one item pending
    h = History().submit(1, [10, 11, 12], lane="exif", photos=[1, 2, 3])
    h.queued(10, 0).claimed(10, 1, 1, W1).pause(1, [(11, 0)]).stopped(10, "paused", 1, 1, W1)
    h.resume(1, [(10, 1), (11, 0)])
    h.queued(11, 0).add("item_deferred", item=11, token=0, worker=W2).queued(11, 0)
    h.claimed(11, 1, 1, W2).released(11, 1, 1, W2).run(10, 1, 1, W1)
    h.cancel(1, [(11, 1), (12, 0)]).finished(1, "cancelled", cancelled=2, succeeded=1)
    # When it is checked against the store (the pause and the release gave their attempts back)
    found = violations(
        h,
        {10: ("succeeded", 2, 1), 11: ("cancelled", 1, 0), 12: ("cancelled", 0, 0)},
        controls={1: "cancel"},
        job_states={1: "cancelled"},
    )
    # Then nothing is reported
    assert found == []


def test_accepts_quarantine_after_max_attempts() -> None:
    # Given an item revoked three times, the third time into failed (quarantine)
    h = History().submit(1, [10])
    for n in range(3):
        h.queued(10, 2 * n).claimed(10, 2 * n + 1, n + 1, W1)
        h.expired(10, 2 * n + 1, n + 1, W1, state="failed" if n == 2 else "pending")
    h.add("item_failed", item=10, token=6, attempt=3, detail={"error": "quarantined"})
    h.finished(1, "failed", failed=1)
    # When it is checked with max_attempts = 3, and with max_attempts = 5
    ok = violations(h, {10: ("failed", 6, 3)}, job_states={1: "failed"}, max_attempts=3)
    early = violations(h, {10: ("failed", 6, 3)}, job_states={1: "failed"}, max_attempts=5)
    # Then it is valid at 3 and reported at 5
    assert ok == []
    one_of(early, "quarantined after 3 attempt(s) < 5")


def test_accepts_shared_overlap_and_sequential_exclusive_locks() -> None:
    # Given analysis (shared) and upload (shared) leases of photo 1 that overlap, then two exif leases
    # one after the other, the second after the first lease was revoked
    h = History().submit(1, [10], lane="analysis", photos=[1]).submit(2, [20], lane="upload", photos=[1])
    h.submit(3, [30], lane="exif", photos=[1]).submit(4, [40], lane="exif", photos=[1])
    h.queued(10, 0).claimed(10, 1, 1, W1).queued(20, 0).claimed(20, 1, 1, W2)
    h.succeeded(10, 1, 1, W1).succeeded(20, 1, 1, W2)
    h.queued(30, 0).claimed(30, 1, 1, W1).expired(30, 1, 1, W1)
    h.queued(40, 0).claimed(40, 1, 1, W2).succeeded(40, 1, 1, W2).run(30, 2, 2, W2)
    for job in (1, 2, 3, 4):
        h.finished(job, succeeded=1)
    # When it is checked
    found = violations(
        h,
        {10: ("succeeded", 1, 1), 20: ("succeeded", 1, 1), 30: ("succeeded", 3, 2), 40: ("succeeded", 1, 1)},
    )
    # Then no overlap is reported
    assert found == []


# -- histories the checker must report ------------------------------------------------------------


def test_reports_a_double_success() -> None:
    # Given an item that succeeds, is claimed again and succeeds again
    h = History().submit(1, [10]).run(10, 0, 1, W1).claimed(10, 2, 2, W2).succeeded(10, 2, 2, W2)
    # When it is checked
    found = violations(h, {10: ("succeeded", 2, 2)})
    # Then both the claim of a succeeded item and the second success are reported
    one_of(found, "item_claimed", "not allowed from state 'succeeded'")
    one_of(found, "succeeded 2 times")


def test_reports_a_zombie_success_after_lease_expired() -> None:
    # Given an item revoked from W1 and re-run by W2, then W1's old token succeeds
    h = History().submit(1, [10]).queued(10, 0).claimed(10, 1, 1, W1).expired(10, 1, 1, W1)
    h.queued(10, 2).claimed(10, 3, 2, W2).succeeded(10, 1, 1, W1)
    # When it is checked
    found = violations(h, {10: ("succeeded", 3, 2)})
    # Then the commit with the expired token is reported
    one_of(found, "token went backwards")
    one_of(found, "after its lease expired")


def test_reports_a_stale_commit_accepted_after_its_rejection() -> None:
    # Given a rejected late commit with token 1 whose change shows up in the log anyway
    h = History().submit(1, [10]).queued(10, 0).claimed(10, 1, 1, W1).expired(10, 1, 1, W1)
    h.stale(10, 1, W1).add(
        "item_released", item=10, token=1, attempt=1, worker=W1, detail={"state": "pending"}
    )
    # When it is checked
    found = violations(h, {10: ("pending", 2, 1)}, job_states={1: "running"}, require_settled=False)
    # Then the accepted stale commit is reported
    one_of(found, "stale commit accepted: token 1 was rejected at cursor")


def test_reports_a_rejection_of_the_valid_lease_and_a_token_jump() -> None:
    # Given a fence that rejects the current lease, and a claim that skips a token
    h = History().submit(1, [10, 11]).queued(10, 0).claimed(10, 1, 1, W1).stale(10, 1, W1)
    h.succeeded(10, 1, 1, W1).queued(11, 0).claimed(11, 2, 1, W2).succeeded(11, 2, 1, W2)
    # When it is checked
    found = violations(h, {10: ("succeeded", 1, 1), 11: ("succeeded", 2, 1)})
    # Then both are reported
    one_of(found, "item 10", "the fence rejected the current, valid lease")
    one_of(found, "item 11", "token 2, expected 1")


def test_reports_success_without_a_claim_and_by_another_worker() -> None:
    # Given an item that succeeds while only queued, and one whose success comes from another worker
    h = History().submit(1, [10, 11]).queued(10, 0).succeeded(10, 0, 0, W1)
    h.queued(11, 0).claimed(11, 1, 1, W1).succeeded(11, 1, 1, W2)
    # When it is checked
    found = violations(h, {10: ("succeeded", 0, 0), 11: ("succeeded", 1, 1)})
    # Then both are reported
    one_of(found, "item 10", "lease commit while 'queued'")
    one_of(found, "item 11", f"committed by {W2} but the lease was claimed by {W1}")


def test_reports_store_disagreeing_with_the_log() -> None:
    # Given a log that ends with the item succeeded, and a store that says it is pending at token 3,
    # with another result than the event's
    h = History().submit(1, [10, 11]).run(10, 0, 1, W1, {"v": 1}).run(11, 0, 1, W1)
    # When it is checked
    found = violations(h, {10: ("succeeded", 1, 1), 11: ("pending", 3, 1)}, results={10: {"v": 2}})
    # Then the differences are reported
    one_of(found, "item 11", "the store holds 'pending' token 3")
    one_of(found, "item 10", "is not the result its item_succeeded event reported")
    one_of(found, "item 11", "not settled")


def test_reports_exclusive_lock_overlaps() -> None:
    # Given two exif leases of photo 1 at once, an analysis lease under an exif lease of photo 2, and an
    # archive lease of photos 3+4 claimed while an exif lease of photo 4 is still held
    h = History().submit(1, [10, 11], lane="exif", photos=[1, 2]).submit(2, [20], lane="exif", photos=[1])
    h.submit(3, [30], lane="analysis", photos=[2]).submit(4, [40], lane="archive", photos=[3])
    h.submit(5, [50], lane="exif", photos=[4])
    h.queued(10, 0).claimed(10, 1, 1, W1).queued(20, 0).claimed(20, 1, 1, W2).succeeded(10, 1, 1, W1)
    h.succeeded(20, 1, 1, W2)
    h.queued(11, 0).claimed(11, 1, 1, W1).queued(30, 0).claimed(30, 1, 1, W2)
    h.succeeded(30, 1, 1, W2).succeeded(11, 1, 1, W1)
    h.queued(50, 0).claimed(50, 1, 1, W1).queued(40, 0).claimed(40, 1, 1, W2, photos=[3, 4])
    states = {i: ("succeeded", 1, 1) for i in (10, 11, 20, 30)}
    states.update({50: ("running", 1, 1), 40: ("running", 1, 1)})
    # When it is checked (not requiring the jobs to have settled)
    found = violations(h, states, require_settled=False)
    # Then the three overlaps are reported, each with both leases
    one_of(found, "photo 1: lock overlap", "item 20", "item 10")
    one_of(found, "photo 2: lock overlap", "item 30", "item 11")
    one_of(found, "photo 4: lock overlap", "item 40", "item 50", "still held")
    assert not any("photo 3" in v for v in found), found


def test_reports_a_worker_pause_that_lost_a_resume_or_a_cancel() -> None:
    # Given items stopped as paused by their workers after the job was resumed (job 1) and after the
    # job was cancelled (job 2)
    h = History().submit(1, [10]).submit(2, [20])
    h.queued(10, 0).claimed(10, 1, 1, W1).pause(1, []).resume(1, []).stopped(10, "paused", 1, 1, W1)
    h.queued(20, 0).claimed(20, 1, 1, W2).pause(2, []).cancel(2, []).stopped(20, "paused", 1, 1, W2)
    # When it is checked against a store where both stay paused
    found = violations(
        h,
        {10: ("paused", 1, 0), 20: ("paused", 1, 0)},
        controls={1: None, 2: "cancel"},
        job_states={1: "paused", 2: "paused"},
    )
    # Then the log and the store both show the lost control request
    one_of(found, "item 10", "stopped by its worker as paused while its job's control is None")
    one_of(found, "item 20", "stopped by its worker as paused while its job's control is 'cancel'")
    one_of(found, "item 10", "nothing will ever resume it")
    one_of(found, "item 20", "job cancelled but the item is paused")


def test_reports_a_phantom_queue_event_once() -> None:
    # Given an item paused, then logged as queued by a dispatcher that did not queue it (its guarded
    # UPDATE skipped the row), then resumed, queued and run normally
    h = History().submit(1, [10]).pause(1, [(10, 0)]).queued(10, 0)
    h.resume(1, [(10, 0)]).run(10, 0, 1, W1).finished(1, succeeded=1)
    # When it is checked
    found = violations(h, {10: ("succeeded", 1, 1)})
    # Then the phantom item_queued is the only violation (the walk does not take it as a change)
    assert len(found) == 1, found
    one_of(found, "item_queued", "not allowed from state 'paused'")


def test_reports_a_cancel_batch_without_its_job_event_and_a_pause_after_cancel() -> None:
    # Given item events of a cancel without job_cancel_requested, and a pause after a cancel
    h = History().submit(1, [10]).submit(2, [20])
    h.add("item_cancelled", item=10, token=0, detail={"reason": "job cancelled"})
    h.cancel(2, [(20, 0)]).add("job_pause_requested", job=2)
    # When it is checked
    found = violations(
        h, {10: ("cancelled", 0, 0), 20: ("cancelled", 0, 0)}, controls={1: "cancel", 2: "cancel"}
    )
    # Then both are reported
    one_of(found, "job 1", "job_cancel_requested closed its batch")
    one_of(found, "job 2", "job_pause_requested after the job was cancelled")


def test_reports_leaked_locks_unsettled_jobs_and_missing_events() -> None:
    # Given a finished exif item whose photo lock is still in the store, a job that is still running,
    # and an item the store holds without any event
    h = History().submit(1, [10], lane="exif", photos=[1]).run(10, 0, 1, W1).submit(2, [20])
    snap = snapshot(
        h,
        {10: ("succeeded", 1, 1), 20: ("pending", 0, 0)},
        job_states={1: "succeeded", 2: "running"},
        locks=[StoredLock(1, 10, "X", 1)],
    )
    snap.items[99] = type(snap.items[20])(99, 2, "noop", "pending", 0, 0)
    # When it is checked
    found = check_history(h.events, snap, job_ids=[1, 2]).violations
    # Then all three are reported
    one_of(found, "photo 1", "outlived its lease")
    one_of(found, "job 2", "did not settle")
    one_of(found, "item 99", "has no events")
    one_of(found, "job 2", "1 item_created events but 2 items stored")


def test_reports_cursor_gaps_and_repeats() -> None:
    # Given event lists with a gap and with a repeated cursor
    h = History().submit(1, [10]).run(10, 0, 1, W1)
    gap = [*h.events[:2], *h.events[3:]]
    repeat = [*h.events[:3], h.events[2], *h.events[3:]]
    # When the cursors are checked
    # Then both are reported, and the complete list is not
    one_of(check_cursors(gap), "cursor gap: expected 3, got 4")
    one_of(check_cursors(repeat), "repeat or step back: expected 4, got 3")
    assert check_cursors(h.events) == []


# -- a real store ---------------------------------------------------------------------------------

NOOP = lane_spec("noop", env={})
EXIF = lane_spec("exif", env={})


def _submit(engine: Engine, tmp_path: Path, names: list[str], spec=NOOP) -> int:  # type: ignore[no-untyped-def]
    photos = [store_jobs.PhotoInput(str(tmp_path / n), 1) for n in names]
    return store_jobs.submit(engine, [spec], photos).job_id


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        return list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())


def test_real_store_protocol_run_is_clean(engine: Engine, tmp_path: Path) -> None:
    # Given two exif jobs over the same photo (their locks conflict) and a noop job
    a = _submit(engine, tmp_path, ["p1.jpg", "p2.jpg"], EXIF)
    b = _submit(engine, tmp_path, ["p1.jpg"], EXIF)
    c = _submit(engine, tmp_path, ["n1", "n2", "n3"])
    take_for_dispatch(engine, EXIF, bound=10)
    take_for_dispatch(engine, NOOP, bound=10)
    a1, a2 = _items(engine, a)
    [b1] = _items(engine, b)
    c1 = _items(engine, c)[0]
    # When the protocol runs: a1 holds photo 1 and b1 is deferred; a1 is released (worker shutdown),
    # b1 then runs and succeeds, and so do a2 and a1; job c is paused mid-item, resumed and cancelled
    lease = store_items.claim(engine, EXIF, a1.id, 0, "w1").lease
    assert lease is not None
    assert store_items.claim(engine, EXIF, b1.id, 0, "w2").deferred
    with fenced(engine, a1.id, lease.token, worker="w1", what="stop") as s:
        store_items.stop(s, lease, "w1", "worker shutting down")
    b_lease = store_items.claim(engine, EXIF, b1.id, 0, "w2").lease
    a2_lease = store_items.claim(engine, EXIF, a2.id, 0, "w1").lease
    assert b_lease is not None and a2_lease is not None
    for ls, w in ((b_lease, "w2"), (a2_lease, "w1")):
        with fenced(engine, ls.item_id, ls.token, worker=w) as s:
            store_items.succeed(s, ls, {"by": w}, w)
    c_lease = store_items.claim(engine, NOOP, c1.id, 0, "w3").lease
    assert c_lease is not None
    store_jobs.pause(engine, c)
    with fenced(engine, c1.id, c_lease.token, worker="w3", what="stop") as s:
        store_items.stop(s, c_lease, "w3", "paused")
    store_jobs.resume(engine, c)
    store_jobs.cancel(engine, c)
    take_for_dispatch(engine, EXIF, bound=10)
    a1_lease = store_items.claim(engine, EXIF, a1.id, 1, "w2").lease
    assert a1_lease is not None
    with fenced(engine, a1.id, a1_lease.token, worker="w2") as s:
        store_items.succeed(s, a1_lease, None, "w2")
    # Then the checker finds the run correct
    assert check(engine, job_ids=[a, b, c]) == []
    assert {i.state for i in _items(engine, c)} == {"cancelled"}


def test_real_store_cursor_gap_and_zombie_event_are_reported(engine: Engine, tmp_path: Path) -> None:
    # Given a finished noop job
    job = _submit(engine, tmp_path, ["n1"])
    [publish] = take_for_dispatch(engine, NOOP, bound=10)
    lease = store_items.claim(engine, NOOP, publish.item_id, publish.token, "w1").lease
    assert lease is not None
    with fenced(engine, lease.item_id, lease.token, worker="w1") as s:
        store_items.succeed(s, lease, None, "w1")
    assert check(engine, job_ids=[job]) == []
    # When an event is written outside the protocol (a second success) and a cursor is moved past a gap
    with Session(engine) as s, s.begin():
        s.add(Event(type="item_succeeded", job_id=job, item_id=lease.item_id, token=lease.token, at=0.0))
    assign_cursors(engine)
    with Session(engine) as s, s.begin():
        top = s.execute(select(func.max(Event.seq))).scalar_one()
        s.execute(update(Event).where(Event.seq == top).values(seq=top + 5))
    found = check(engine, job_ids=[job])
    # Then the checker reports both
    one_of(found, "cursor gap")
    one_of(found, "succeeded 2 times")


# -- retry and prune (issue 22) ---------------------------------------------------------------------
def _cancelled_then_retried() -> History:
    h = History().submit(1, [10, 11])
    h.run(10, 0, 1, W1).cancel(1, [(11, 0)]).finished(1, "cancelled", cancelled=1, succeeded=1)
    h.add("item_retried", item=11, token=0, detail={"from": "cancelled", "state": "pending"})
    return h.add("job_retried", job=1, detail={"items": 1})


def test_accepts_a_cancelled_job_retried_to_the_end() -> None:
    # Given a job cancelled with one item pending, then retried: the item runs with fresh attempts
    h = _cancelled_then_retried().run(11, 0, 1, W2).finished(1, succeeded=2)
    # When it is checked against a store where both items succeeded and the cancel was lifted
    found = violations(h, {10: ("succeeded", 1, 1), 11: ("succeeded", 1, 1)}, controls={1: None})
    # Then nothing is reported
    assert found == []


def test_reports_a_retry_of_an_item_that_had_not_ended() -> None:
    # Given a retry event for an item that is still pending
    h = History().submit(1, [10])
    h.add("item_retried", item=10, token=0, detail={"from": "pending", "state": "pending"})
    h.add("job_retried", job=1, detail={"items": 1})
    # When it is checked, then the walk reports it
    one_of(violations(h, {10: ("pending", 0, 0)}, require_settled=False), "item 10", "not allowed from state")


def test_a_pruned_job_is_checked_from_its_history() -> None:
    # Given a job pruned after it finished, and one "pruned" while its retried item was still pending
    h = History().submit(1, [10]).run(10, 0, 1, W1)
    done = check_history(h.events, snapshot(h, {}), job_ids=set(), pruned={1}).violations
    g = _cancelled_then_retried()
    unfinished = check_history(g.events, snapshot(g, {}), job_ids=set(), pruned={1}).violations
    # Then the finished one passes and the other is reported
    assert done == []
    one_of(unfinished, "item 11", "pruned while the item was 'pending'")


def test_reports_a_missing_early_or_doubled_job_finished() -> None:
    """Given three jobs: one whose items all ended without job_finished, one finished while an item
    still ran, one finished twice (no retry between)
    When the histories are checked
    Then each is reported (issue 38: exactly one job_finished per finish, in its last item's commit)."""
    h = History().submit(1, [10]).run(10, 0, 1, W1)
    h.submit(2, [20, 21]).run(20, 0, 1, W1).finished(2, succeeded=1).run(21, 0, 1, W2)
    h.submit(3, [30]).run(30, 0, 1, W1).finished(3, succeeded=1).finished(3, succeeded=1)
    states = {i: ("succeeded", 1, 1) for i in (10, 20, 21, 30)}
    found = violations(h, states)
    one_of(found, "job 1", "no job_finished")
    one_of(found, "job 2", "job_finished while items are")
    one_of(found, "job 3", "job_finished written twice")
