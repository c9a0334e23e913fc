"""The hot path's statement budget (issue 9): how many SQL statements a claim, a renew and a fenced
succeed execute, counted with a ``before_cursor_execute`` listener on SQLite and PostgreSQL.

Not a timing test: a regression back to ORM entity loading, a separate fence check or a per-item
clock round trip adds statements, and these counts fail loudly.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.fencing import fenced, fenced_batch
from store.intents import set_photo_hash
from store.lanes import lane_spec
from store.models import Item, PhotoLock
from tests.support import event_counts

NOOP = lane_spec("noop", env={})
EXIF = lane_spec("exif", env={})  # an exclusive photo lock
ANALYSIS = lane_spec("analysis", env={})

# The budget: statements sent to the database (SQLite's BEGIN IMMEDIATE not counted; COMMIT is no statement).
CLAIM = 2  # UPDATE … RETURNING (token, state, lane and job checked in its WHERE) + the event INSERT
CLAIM_LOCKED = 5  # + the photo row lock, the lock conflicts read, the lock INSERT
RENEW = 1  # UPDATE … RETURNING the job's control request
SUCCEED_LAST_LANE = 2  # the fenced UPDATE … RETURNING + the event INSERT (no separate fence read)
# An analysis success: the fenced UPDATE, the photo's hash, the lock rows dropped unless an intent
# is unsettled (one DELETE … NOT EXISTS), the event INSERT
SUCCEED_LOCKED_WITH_HASH = 4
# A batch message's claim and finish: each item's compare-and-set, and one INSERT of all its events.
BATCH_EVENTS = 1
# Issue 38: a transaction that may end its job's last item checks whether it did (store.job_end): on
# PostgreSQL the job's end lock and one check statement, on SQLite the check; when it did (once per
# job: these one-job tests end their job), the counts by state, the job_ends row and job_finished.
JOB_END_CHECK = {"sqlite": 1, "postgresql": 2}
JOB_FINISHED = 3


def job_end(engine: Engine) -> int:
    """What a finish that ends its job adds (store.job_end)."""
    return JOB_END_CHECK[engine.dialect.name] + JOB_FINISHED


class Counter:
    def __init__(self) -> None:
        self.statements: list[str] = []

    def __call__(self, conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if not statement.lstrip().upper().startswith("BEGIN"):
            self.statements.append(statement)


@contextmanager
def counting(engine: Engine) -> Iterator[Counter]:
    counter = Counter()
    event.listen(engine, "before_cursor_execute", counter)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", counter)


def queued_item(engine: Engine, tmp_path: Path, specs: list) -> Item:  # type: ignore[type-arg]
    photos = [store_jobs.PhotoInput(str(tmp_path / "p.jpg"), 1)]
    job = store_jobs.submit(engine, specs, photos).job_id
    take_for_dispatch(engine, specs[0])
    with Session(engine) as s:
        return s.execute(select(Item).where(Item.job_id == job, Item.position == 0)).scalar_one()


def explain(counter: Counter) -> str:
    return "\n".join(f"  {i + 1}. {s.split(chr(10))[0][:140]}" for i, s in enumerate(counter.statements))


def test_claim_renew_and_succeed_stay_within_their_statement_budget(engine: Engine, tmp_path: Path) -> None:
    # Given a queued no-op item (a one-lane job)
    item = queued_item(engine, tmp_path, [NOOP])
    store_items.claim(engine, NOOP, 999_999, 0, "warm-up")  # compile caches and pool warmed

    # When a worker claims it, renews its lease and finishes it through the fence
    with counting(engine) as claim:
        lease = store_items.claim(engine, NOOP, item.id, item.fencing_token, "w").lease
    assert lease is not None
    with counting(engine) as renew:
        renewal = store_items.renew(engine, {item.id: lease.token})
    assert renewal.held == {item.id: None}
    with counting(engine) as succeed:
        with fenced(engine, lease.item_id, lease.token, worker="w", what="succeed") as s:
            store_items.succeed(s, lease, {"ok": True}, "w")

    # Then each stays within its budget, and the work was done
    assert len(claim.statements) <= CLAIM, f"claim ran {len(claim.statements)} statements:\n{explain(claim)}"
    assert len(renew.statements) <= RENEW, f"renew ran {len(renew.statements)} statements:\n{explain(renew)}"
    assert len(succeed.statements) <= SUCCEED_LAST_LANE + job_end(engine), (
        f"fenced succeed ran {len(succeed.statements)} statements:\n{explain(succeed)}"
    )
    assert event_counts(engine, "item_succeeded", item.job_id) == {item.id: 1}
    assert event_counts(engine, "job_finished", item.job_id) == {None: 1}


def test_a_locking_claim_stays_within_its_budget(engine: Engine, tmp_path: Path) -> None:
    # Given a queued item of a lane that takes an exclusive photo lock
    item = queued_item(engine, tmp_path, [EXIF])
    store_items.claim(engine, EXIF, 999_999, 0, "warm-up")

    # When a worker claims it
    with counting(engine) as claim:
        lease = store_items.claim(engine, EXIF, item.id, item.fencing_token, "w").lease

    # Then the claim holds the lock and stays within the budget
    assert lease is not None and lease.holds_locks
    assert len(claim.statements) <= CLAIM_LOCKED, (
        f"claim ran {len(claim.statements)} statements:\n{explain(claim)}"
    )


def test_a_locking_succeed_releases_its_lock_within_its_budget(engine: Engine, tmp_path: Path) -> None:
    # Given a claimed analysis item holding its shared photo lock
    item = queued_item(engine, tmp_path, [ANALYSIS])
    store_items.claim(engine, ANALYSIS, 999_999, 0, "warm-up")
    lease = store_items.claim(engine, ANALYSIS, item.id, item.fencing_token, "w").lease
    assert lease is not None and lease.holds_locks and lease.photo_id is not None
    photo_id = lease.photo_id

    # When it succeeds through the fence, recording the photo's hash
    with counting(engine) as succeed:
        with fenced(engine, lease.item_id, lease.token, worker="w", what="succeed") as s:
            hashed = [lambda s: set_photo_hash(s, photo_id, "ab", 2)]
            store_items.succeed(s, lease, {"sha256": "ab"}, "w", hashed)

    # Then the lock is gone (no intent keeps it) and the finish stayed within its budget
    with Session(engine) as s:
        assert s.execute(select(PhotoLock)).first() is None
    assert len(succeed.statements) <= SUCCEED_LOCKED_WITH_HASH + job_end(engine), (
        f"fenced succeed ran {len(succeed.statements)} statements:\n{explain(succeed)}"
    )
    assert event_counts(engine, "item_succeeded", item.job_id) == {item.id: 1}


def test_a_stale_succeed_still_writes_nothing_within_the_budget(engine: Engine, tmp_path: Path) -> None:
    # Given a claimed item whose lease was revoked and claimed again by another worker
    item = queued_item(engine, tmp_path, [NOOP])
    old = store_items.claim(engine, NOOP, item.id, item.fencing_token, "w1").lease
    assert old is not None
    with Session(engine) as s, s.begin():
        s.execute(
            Item.__table__.update()
            .where(Item.id == item.id)
            .values(state="queued", fencing_token=old.token + 1)
        )
    new = store_items.claim(engine, NOOP, item.id, old.token + 1, "w2").lease
    assert new is not None

    # When the old holder's fenced succeed runs
    from store.errors import StaleLease

    try:
        with fenced(engine, old.item_id, old.token, worker="w1", what="succeed") as s:
            store_items.succeed(s, old, {"ok": True}, "w1")
    except StaleLease:
        refused = True
    else:
        refused = False

    # Then it is refused, the item is still the new holder's and no success was recorded
    assert refused
    with Session(engine) as s:
        row = s.execute(select(Item.state, Item.fencing_token).where(Item.id == item.id)).one()
    assert tuple(row) == ("running", new.token)
    assert event_counts(engine, "item_succeeded", item.job_id) == {}
    assert event_counts(engine, "stale_commit_rejected", item.job_id) == {item.id: 1}


def test_a_middle_lane_succeed_makes_the_next_lane_ready(engine: Engine, tmp_path: Path) -> None:
    # Given a two-lane job whose first item is claimed
    item = queued_item(engine, tmp_path, [ANALYSIS, NOOP])
    lease = store_items.claim(engine, ANALYSIS, item.id, item.fencing_token, "w").lease
    assert lease is not None
    # When it succeeds through the fence
    with fenced(engine, lease.item_id, lease.token, worker="w", what="succeed") as s:
        store_items.succeed(s, lease, None, "w")
    # Then the photo's next-lane item is pending, with its item_ready event
    with Session(engine) as s:
        nxt = s.execute(select(Item).where(Item.job_id == item.job_id, Item.position == 1)).scalar_one()
    assert nxt.state == "pending"
    assert event_counts(engine, "item_ready", item.job_id) == {nxt.id: 1}


def test_a_batch_is_claimed_and_finished_within_its_items_budget_in_two_transactions(
    engine: Engine, tmp_path: Path
) -> None:
    # Given eight queued no-op items (a batch message's worth)
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(8)]
    job = store_jobs.submit(engine, [NOOP], photos).job_id
    pairs = [(p.item_id, p.token) for p in take_for_dispatch(engine, NOOP)]
    store_items.claim(engine, NOOP, 999_999, 0, "warm-up")
    commits: list[int] = []
    event.listen(engine, "commit", lambda conn: commits.append(1))

    # When a worker claims them as one batch and finishes them in one fenced transaction
    with counting(engine) as claim:
        outcomes = store_items.claim_batch(engine, NOOP, pairs, "w", {})
    leases = [o.lease for o in outcomes]
    assert all(lease is not None for lease in leases)
    with counting(engine) as succeed:
        with fenced_batch(engine, [lease.item_id for lease in leases if lease]) as s:
            for lease in leases:
                assert lease is not None
                store_items.succeed(s, lease, {"ok": True}, "w")

    # Then each item costs its compare-and-set, and the batch's event rows one statement (an
    # executemany), both took one transaction, and every item succeeded once
    assert len(claim.statements) <= 8 + BATCH_EVENTS, f"batch claim ran:\n{explain(claim)}"
    budget = 8 + BATCH_EVENTS + job_end(engine)
    assert len(succeed.statements) <= budget, f"batch succeed ran:\n{explain(succeed)}"
    assert len(commits) == 2
    assert event_counts(engine, "item_succeeded", job) == {lease.item_id: 1 for lease in leases if lease}


# Issue 32: a batch message's claim and plain finish cost a fixed number of statements, whatever its
# size (16 items here, the no-op lane's batch): one compare-and-set for every item and one INSERT of
# their events; the finish on PostgreSQL also locks the batch's jobs and items first (lock order),
# then one compare-and-set for every plain success (last lane, no photo lock, no writes of its own).
BATCH_CLAIM = 2
BATCH_PLAIN_FINISH = {"sqlite": 2, "postgresql": 4}


def test_a_batch_claim_and_plain_finish_cost_the_same_statements_for_any_batch_size(
    engine: Engine, tmp_path: Path
) -> None:
    # Given sixteen queued no-op items in one batch message
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(16)]
    job = store_jobs.submit(engine, [NOOP], photos).job_id
    published = take_for_dispatch(engine, NOOP)
    assert len({p.group for p in published}) == 1 and len(published) == 16
    pairs = [(p.item_id, p.token) for p in published]
    store_items.claim(engine, NOOP, 999_999, 0, "warm-up")

    # When a worker claims them as one batch and finishes them as middleware.finishing does
    with counting(engine) as claim:
        outcomes = store_items.claim_batch(engine, NOOP, pairs, "w", {})
    leases = [o.lease for o in outcomes if o.lease is not None]
    assert len(leases) == 16 and all(store_items.plain_success(lease) for lease in leases)
    with counting(engine) as finish:
        with fenced_batch(engine, [lease.item_id for lease in leases]) as s:
            store_items.lock_batch_finish(s, leases, {lease.item_id for lease in leases})
            store_items.succeed_many(s, [(lease, {"ok": True}) for lease in leases], "w")

    # Then the claim is two statements and the finish a store's fixed few, and every item
    # succeeded once, with its event
    assert len(claim.statements) == BATCH_CLAIM, f"batch claim ran:\n{explain(claim)}"
    budget = BATCH_PLAIN_FINISH[engine.dialect.name] + job_end(engine)
    assert len(finish.statements) == budget, f"batch finish ran:\n{explain(finish)}"
    assert event_counts(engine, "item_succeeded", job) == {lease.item_id: 1 for lease in leases}
    with Session(engine) as s:
        states = s.execute(select(Item.state, Item.result).where(Item.job_id == job)).all()
    assert {(st, str(r)) for st, r in states} == {("succeeded", "{'ok': True}")}


def test_a_plain_batch_finish_with_one_stale_lease_commits_nothing(engine: Engine, tmp_path: Path) -> None:
    # Given four claimed no-op items of a batch, one of whose leases was revoked and claimed again
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(4)]
    job = store_jobs.submit(engine, [NOOP], photos).job_id
    pairs = [(p.item_id, p.token) for p in take_for_dispatch(engine, NOOP)]
    leases = [o.lease for o in store_items.claim_batch(engine, NOOP, pairs, "w1", {}) if o.lease]
    stale = leases[2]
    with Session(engine) as s, s.begin():
        s.execute(
            Item.__table__.update()
            .where(Item.id == stale.item_id)
            .values(state="queued", fencing_token=stale.token + 1)
        )
    assert store_items.claim(engine, NOOP, stale.item_id, stale.token + 1, "w2").lease is not None

    # When the old holder finishes the four together
    from store.errors import StaleLease

    try:
        with fenced_batch(engine, [lease.item_id for lease in leases]) as s:
            store_items.lock_batch_finish(s, leases, {lease.item_id for lease in leases})
            store_items.succeed_many(s, [(lease, None) for lease in leases], "w1")
    except StaleLease as exc:
        refused = exc.item_id
    else:
        refused = None

    # Then the stale lease is named, nothing of the batch committed, and the item is the new holder's
    assert refused == stale.item_id
    assert event_counts(engine, "item_succeeded", job) == {}
    with Session(engine) as s:
        rows = dict(s.execute(select(Item.id, Item.state).where(Item.job_id == job)).all())
    assert set(rows.values()) == {"running"}
