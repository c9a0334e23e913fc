"""The lease protocol against the real store (SQLite and PostgreSQL): claim, renew, fence, revoke."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select, update
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.clock import db_now
from store.dispatch import take_for_dispatch
from store.errors import StaleLease
from store.events import read_events
from store.fencing import fenced
from store.lane_control import pause_lane, resume_lane
from store.lanes import lane_spec
from store.leases import ClaimRefusal
from store.models import Event, Item
from store.sweeper import revoke_expired
from tests.support import event_counts, item_row, wait_for

NOOP = lane_spec("noop", env={})


def submit(engine: Engine, tmp_path: Path, n: int = 3, spec=NOOP) -> int:  # type: ignore[no-untyped-def]
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(n)]
    return store_jobs.submit(engine, [spec], photos).job_id


def first_item(engine: Engine, job_id: int) -> Item:
    with Session(engine) as s:
        return s.execute(select(Item).where(Item.job_id == job_id).order_by(Item.id)).scalars().first()  # type: ignore[return-value]


def test_claim_is_a_compare_and_set(engine: Engine, tmp_path: Path) -> None:
    # Given a queued item
    job = submit(engine, tmp_path)
    take_for_dispatch(engine, NOOP)
    item = first_item(engine, job)
    assert item.state == "queued" and item.fencing_token == 0
    # When two deliveries of the same message try to claim it
    first = store_items.claim(engine, NOOP, item.id, 0, "w1")
    second = store_items.claim(engine, NOOP, item.id, 0, "w2")
    # Then only the first wins, with a bumped token and attempt, and one item_claimed event
    assert first.lease is not None and first.lease.token == 1 and first.lease.attempt == 1
    assert second.lease is None and "stale token" in second.reason
    assert event_counts(engine, "item_claimed", job) == {item.id: 1}
    # And a claim naming the item's *current* token is refused by its state alone: while it runs,
    # and after it succeeded (the compare-and-set checks the state, not only the token)
    running = store_items.claim(engine, NOOP, item.id, first.lease.token, "w3")
    assert running.lease is None and "is running, not claimable" in running.reason
    with fenced(engine, item.id, first.lease.token) as s:
        store_items.succeed(s, first.lease, {"ok": 1}, "w1")
    done = store_items.claim(engine, NOOP, item.id, first.lease.token, "w4")
    assert done.lease is None and "is succeeded, not claimable" in done.reason
    row = first_item(engine, job)
    assert (row.state, row.fencing_token, row.attempt) == ("succeeded", 1, 1)
    assert event_counts(engine, "item_claimed", job) == {item.id: 1}


def test_a_message_older_than_the_items_token_is_refused_though_the_item_is_claimable(
    engine: Engine, tmp_path: Path
) -> None:
    # Given an item whose first lease was revoked (pending again, at token 2)
    spec = replace(NOOP, lease_ttl=0.05)
    job = submit(engine, tmp_path, n=1, spec=spec)
    item = first_item(engine, job)
    assert store_items.claim(engine, spec, item.id, 0, "w1").lease is not None
    wait_for(lambda: revoke_expired(engine, {"noop": spec})[0], 5, what="the revocation")
    assert (first_item(engine, job).state, first_item(engine, job).fencing_token) == ("pending", 2)
    # When the first message (token 0) is delivered again
    old = store_items.claim(engine, spec, item.id, 0, "w2")
    # Then the token alone refuses it: the item stays pending at its token, its next message claims it
    assert old.lease is None and old.refusal == ClaimRefusal.STALE_TOKEN, old.reason
    assert (first_item(engine, job).state, first_item(engine, job).fencing_token) == ("pending", 2)
    assert store_items.claim(engine, spec, item.id, 2, "w3").lease is not None


def test_a_claim_in_a_paused_lane_is_refused_and_the_item_claimable_after_the_resume(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a lane with one queued item and one pending item, then paused
    job = submit(engine, tmp_path, n=2)
    [queued] = take_for_dispatch(engine, NOOP, bound=1)
    assert pause_lane(engine, "noop", "test")
    # When the dispatcher runs, and the queued item's message is delivered
    dispatched = take_for_dispatch(engine, NOOP)
    refused = store_items.claim(engine, NOOP, queued.item_id, queued.token, "w")
    # Then the paused lane gets nothing: no dispatch, and the claim is refused for the pause
    assert dispatched == []
    assert refused.lease is None and refused.refusal == ClaimRefusal.LANE_PAUSED, refused.reason
    row = item_row(engine, queued.item_id)
    assert (row.state, row.fencing_token, row.attempt, row.lease_owner) == ("pending", 0, 0, None)
    assert event_counts(engine, "item_claimed", job) == {}
    # And after the lane's resume the other item is dispatched, and both are claimed
    assert resume_lane(engine, "noop", "test")
    [other] = take_for_dispatch(engine, NOOP)
    assert other.item_id != queued.item_id
    for pub in (queued, other):
        assert store_items.claim(engine, NOOP, pub.item_id, pub.token, "w").lease is not None


def test_claim_skips_unknown_item_and_wrong_lane(engine: Engine, tmp_path: Path) -> None:
    # Given a noop item
    job = submit(engine, tmp_path)
    item = first_item(engine, job)
    # When messages name an unknown item, or come from another lane
    unknown = store_items.claim(engine, NOOP, 999_999, 0, "w")
    wrong = store_items.claim(engine, lane_spec("exif", env={}), item.id, 0, "w")
    # Then neither claims anything
    assert unknown.lease is None and "unknown item" in unknown.reason
    assert wrong.lease is None and "belongs to lane" in wrong.reason
    assert first_item(engine, job).state == "pending"


def _lease_and_clock(engine: Engine, item_id: int) -> tuple[float, float]:
    """(the item's lease expiry, the database clock now)."""
    with Session(engine) as s:
        row = s.execute(select(Item.lease_expires_at, db_now()).where(Item.id == item_id)).one()
        return row[0], row[1]


def test_renew_is_guarded_by_token_and_reports_control(engine: Engine, tmp_path: Path) -> None:
    # Given a claimed item whose lease is about to run out (its expiry set 1,000 s into the past)
    spec = replace(NOOP, lease_ttl=30.0)
    job = submit(engine, tmp_path, spec=spec)
    item = first_item(engine, job)
    lease = store_items.claim(engine, spec, item.id, 0, "w").lease
    assert lease is not None
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id == item.id).values(lease_expires_at=db_now() - 1000))
    _, before = _lease_and_clock(engine, item.id)
    # When the heartbeat renews with the right and with a wrong token
    ok = store_items.renew(engine, {item.id: lease.token})
    expires, after = _lease_and_clock(engine, item.id)
    stale = store_items.renew(engine, {item.id: lease.token + 5})
    # Then the right one extends the lease to the lane's TTL from the database clock at the renewal
    assert ok.held == {item.id: None} and not ok.lost
    assert before + spec.lease_ttl <= expires <= after + spec.lease_ttl, (before, expires, after)
    # And the wrong one is reported lost and changes nothing
    assert stale.lost == {item.id} and not stale.held
    assert _lease_and_clock(engine, item.id)[0] == expires
    # And a cancel request reaches the heartbeat
    store_jobs.cancel(engine, job)
    assert store_items.renew(engine, {item.id: lease.token}).held == {item.id: "cancel"}


def test_fenced_commit_after_revocation_is_rejected(engine: Engine, tmp_path: Path) -> None:
    # Given an item claimed by a worker whose lease then expires and is revoked by the sweeper
    spec = replace(NOOP, lease_ttl=0.05)
    job = submit(engine, tmp_path, spec=spec)
    item = first_item(engine, job)
    lease = store_items.claim(engine, spec, item.id, 0, "zombie").lease
    assert lease is not None
    wait_for(lambda: revoke_expired(engine, {"noop": spec})[0], 5, what="the sweeper to revoke the lease")
    # When the old holder commits a write through its fence (a plain write: no finishing
    # compare-and-set of its own that could refuse it first — the fence alone must)
    with pytest.raises(StaleLease):
        with fenced(engine, item.id, lease.token, worker="zombie") as s:
            s.execute(update(Item).where(Item.id == item.id).values(result={"zombie": True}))
    # Then nothing it wrote is visible and a stale_commit_rejected event is recorded
    row = first_item(engine, job)
    assert row.state == "pending" and row.result is None and row.fencing_token == lease.token + 1
    assert event_counts(engine, "stale_commit_rejected", job) == {item.id: 1}
    # When another worker wins the item (running again) and the old holder writes once more
    winner = store_items.claim(engine, NOOP, item.id, lease.token + 1, "winner").lease
    assert winner is not None
    with pytest.raises(StaleLease):
        with fenced(engine, item.id, lease.token, worker="zombie") as s:
            s.execute(update(Item).where(Item.id == item.id).values(result={"zombie": True}))
    # Then the fence refuses it by its token (the state, running, is the winner's)
    row = first_item(engine, job)
    assert (row.state, row.lease_owner, row.result) == ("running", "winner", None)
    assert event_counts(engine, "stale_commit_rejected", job) == {item.id: 2}
    assert event_counts(engine, "item_succeeded", job) == {}


def test_a_zombies_succeed_after_its_item_was_claimed_again_is_rejected(
    engine: Engine, tmp_path: Path
) -> None:
    # Given an item whose lease was revoked and which another worker then claimed (running again)
    spec = replace(NOOP, lease_ttl=0.05)
    job = submit(engine, tmp_path, n=1, spec=spec)
    item = first_item(engine, job)
    zombie = store_items.claim(engine, spec, item.id, 0, "zombie").lease
    assert zombie is not None
    wait_for(lambda: revoke_expired(engine, {"noop": spec})[0], 5, what="the revocation")
    winner = store_items.claim(engine, NOOP, item.id, 2, "winner").lease
    assert winner is not None
    # When the zombie finishes its item through its fence
    with pytest.raises(StaleLease):
        with fenced(engine, item.id, zombie.token, worker="zombie") as s:
            store_items.succeed(s, zombie, {"zombie": True}, "zombie")
    # Then the winner's lease is untouched and only the winner's result lands
    row = first_item(engine, job)
    assert (row.state, row.lease_owner, row.fencing_token, row.result) == ("running", "winner", 3, None)
    with fenced(engine, item.id, winner.token, worker="winner") as s:
        store_items.succeed(s, winner, {"winner": True}, "winner")
    assert first_item(engine, job).result == {"winner": True}
    assert event_counts(engine, "item_succeeded", job) == {item.id: 1}


def test_fenced_commit_while_lease_holds_succeeds(engine: Engine, tmp_path: Path) -> None:
    # Given a claimed item
    job = submit(engine, tmp_path)
    item = first_item(engine, job)
    lease = store_items.claim(engine, NOOP, item.id, 0, "w").lease
    assert lease is not None
    # When it checkpoints and succeeds through the fence
    with fenced(engine, item.id, lease.token) as s:
        store_items.save_checkpoint(s, lease, {"step": 1})
    with fenced(engine, item.id, lease.token) as s:
        store_items.succeed(s, lease, {"ok": 1}, "w")
    # Then both commits land
    row = first_item(engine, job)
    assert row.state == "succeeded" and row.checkpoint == {"step": 1} and row.result == {"ok": 1}


def test_expired_leases_are_quarantined_after_max_attempts(engine: Engine, tmp_path: Path) -> None:
    # Given a lane allowing 2 attempts with very short leases
    spec = replace(NOOP, lease_ttl=0.05, max_attempts=2)
    job = submit(engine, tmp_path, n=1, spec=spec)
    item = first_item(engine, job)
    # When the item's worker "dies" twice (claims whose leases are never renewed)
    for _attempt in range(2):
        token = first_item(engine, job).fencing_token
        assert store_items.claim(engine, spec, item.id, token, "doomed").lease is not None
        wait_for(lambda: revoke_expired(engine, {"noop": spec})[0], 5, what="revocation")
    # Then it is failed with the quarantine reason, not retried forever
    row = first_item(engine, job)
    assert row.state == "failed"
    assert row.error == "quarantined: killed its worker 2 times"
    assert event_counts(engine, "lease_expired", job) == {item.id: 2}


def test_a_live_lease_survives_the_sweep_that_revokes_an_expired_one(engine: Engine, tmp_path: Path) -> None:
    # Given two claimed items: one whose lease has run out, one whose lease holds for a minute
    short, long = replace(NOOP, lease_ttl=0.05), replace(NOOP, lease_ttl=60.0)
    job = submit(engine, tmp_path, n=2, spec=short)
    with Session(engine) as s:
        dead, live = s.execute(select(Item.id).where(Item.job_id == job).order_by(Item.id)).scalars().all()
    assert store_items.claim(engine, short, dead, 0, "dead").lease is not None
    assert store_items.claim(engine, long, live, 0, "live").lease is not None
    wait_for(lambda: _lease_and_clock(engine, dead)[0] < _lease_and_clock(engine, dead)[1], 10, what="expiry")
    # When the sweeper runs
    revoked = revoke_expired(engine, {"noop": short})
    # Then only the expired lease is revoked; the live one keeps its state, token, owner and expiry
    assert revoked == (1, 0)
    assert event_counts(engine, "lease_expired", job) == {dead: 1}
    row = item_row(engine, live)
    assert (row.state, row.fencing_token, row.lease_owner) == ("running", 1, "live")
    assert row.lease_expires_at is not None
    assert (first_item(engine, job).state, first_item(engine, job).fencing_token) == ("pending", 2)


def test_many_sweepers_revoke_each_lease_once(engine: Engine, tmp_path: Path) -> None:
    # Given 20 claimed items whose leases expire
    spec = replace(NOOP, lease_ttl=0.05)
    job = submit(engine, tmp_path, n=20, spec=spec)
    with Session(engine) as s:
        ids = s.execute(select(Item.id).where(Item.job_id == job)).scalars().all()
    for i in ids:
        assert store_items.claim(engine, spec, i, 0, "w").lease is not None

    def all_expired() -> bool:  # by the database clock, which the sweepers compare against
        with Session(engine) as s:
            live = select(func.count()).where(Item.job_id == job, Item.lease_expires_at >= db_now())
            return s.execute(live).scalar_one() == 0

    wait_for(all_expired, 10, what="every lease to expire")
    # When four sweepers run at once, repeatedly
    totals: list[int] = []

    def sweep() -> None:
        for _ in range(20):
            totals.append(revoke_expired(engine, {"noop": spec})[0])

    threads = [threading.Thread(target=sweep) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # Then every lease was revoked exactly once
    assert sum(totals) == 20
    assert event_counts(engine, "lease_expired", job) == dict.fromkeys(ids, 1)


def test_dispatch_respects_the_bound_and_is_fair(engine: Engine, tmp_path: Path) -> None:
    # Given two jobs of 50 items in the same lane and a bound of 10
    a = submit(engine, tmp_path / "a", n=50)
    b = submit(engine, tmp_path / "b", n=50)
    # When the dispatcher runs twice
    first = take_for_dispatch(engine, NOOP, bound=10)
    again = take_for_dispatch(engine, NOOP, bound=10)
    # Then at most the bound is queued, shared between both jobs
    assert len(first) == 10 and again == []
    with Session(engine) as s:
        jobs = [s.get(Item, p.item_id).job_id for p in first]  # type: ignore[union-attr]
    assert jobs.count(a) == 5 and jobs.count(b) == 5


def test_events_follow_commit_order_without_gaps(engine: Engine, tmp_path: Path) -> None:
    # Given many writers changing items concurrently while a follower reads by cursor
    job = submit(engine, tmp_path, n=60)
    with Session(engine) as s:
        ids = s.execute(select(Item.id).where(Item.job_id == job)).scalars().all()
    seen: list[int] = []
    done = threading.Event()

    def follow() -> None:
        cursor = 0
        while True:
            finished = done.is_set()
            for e in read_events(engine, after=cursor):
                seen.append(e.cursor)
                cursor = e.cursor
            if finished:
                return

    def write(chunk: list[int]) -> None:
        for i in chunk:
            lease = store_items.claim(engine, NOOP, i, 0, "w").lease
            assert lease is not None
            with fenced(engine, i, lease.token) as s:
                store_items.succeed(s, lease, None, "w")

    follower = threading.Thread(target=follow)
    follower.start()
    writers = [threading.Thread(target=write, args=(list(ids[k::6]),)) for k in range(6)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    done.set()
    follower.join()
    # Then the follower saw every event row of the table exactly once, in cursor order, with no gap
    # (counted from the table itself, not from what the cursor reader returns)
    with Session(engine) as s:
        rows = s.execute(select(func.count()).select_from(Event)).scalar_one()
    assert rows == 60 + 1 + 60 * 2 + 1  # created + submitted + claimed/succeeded + job_finished
    assert seen == list(range(1, rows + 1))
    everything = [e.cursor for e in read_events(engine, after=0, limit=100_000)]
    assert seen == everything


def test_event_committed_late_with_a_lower_id_is_not_missed(pg_url: str) -> None:
    # Given (PostgreSQL) a transaction that wrote an event but has not committed yet
    from store.engine import make_engine
    from store.events import emit

    engine = make_engine(pg_url)
    slow = Session(engine)
    slow.begin()
    emit(slow, "slow_event")
    slow.flush()
    # And a later transaction whose event (higher id) commits first
    with Session(engine) as fast, fast.begin():
        emit(fast, "fast_event")
    # When a follower reads, then the slow transaction commits, then the follower reads on
    first = read_events(engine, after=0)
    slow.commit()
    slow.close()
    second = read_events(engine, after=first[-1].cursor)
    # Then the follower sees both events exactly once, the late one after the early one
    assert [e.type for e in first] == ["fast_event"]
    assert [e.type for e in second] == ["slow_event"]
    # And ordering by id alone would have missed it: its id is lower than the one already seen
    with Session(engine) as s:
        from store.models import Event

        ids = dict(s.execute(select(Event.type, Event.id)).all())
    assert ids["slow_event"] < ids["fast_event"]
    engine.dispose()
