"""Batch claims (``store.items.claim_batch``) of a lane with photo locks, on SQLite and PostgreSQL:
a locked photo defers its item alone, and two batches whose photos come in crossed orders claim
without a deadlock (all of a batch's photos are locked at once, in ascending id)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, func, select, text, update
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.fencing import fenced_batch
from store.intents import set_photo_hash
from store.lanes import lane_spec
from store.models import Item, PhotoLock
from store.photo_locks import EXCLUSIVE, SHARED, LockRequest
from tests.support import events_of

ANALYSIS = lane_spec("analysis", env={})  # a shared photo lock
EXIF = lane_spec("exif", env={})  # an exclusive one
NOOP = lane_spec("noop", env={})  # no lock


def queued(engine: Engine, spec: Any, paths: list[Path]) -> list[tuple[int, int, int]]:
    """A job of ``spec``'s lane over ``paths``, dispatched: (item id, token, photo id) in item order."""
    job = store_jobs.submit(engine, [spec], [store_jobs.PhotoInput(str(p), 1) for p in paths]).job_id
    take_for_dispatch(engine, spec)
    with Session(engine) as s:
        rows = s.execute(
            select(Item.id, Item.fencing_token, Item.photo_id).where(Item.job_id == job).order_by(Item.id)
        ).all()
    return [(r.id, r.fencing_token, r.photo_id) for r in rows]


def test_a_locked_photo_defers_its_item_alone_and_leaves_it_as_before(engine: Engine, tmp_path: Path) -> None:
    # Given three queued analysis items, the second one's photo held exclusively by an exif item
    paths = [tmp_path / f"p{i}.jpg" for i in range(3)]
    items = queued(engine, ANALYSIS, paths)
    [(exif_item, exif_token, _)] = queued(engine, EXIF, [paths[1]])
    holder = store_items.claim(engine, EXIF, exif_item, exif_token, "other", LockRequest(EXCLUSIVE, 0.2))
    assert holder.lease is not None
    # When a worker claims the three as one batch
    request = LockRequest(SHARED, 0.5)
    requests = dict.fromkeys([i for i, _, _ in items], request)
    outcomes = store_items.claim_batch(engine, ANALYSIS, [(i, t) for i, t, _ in items], "w", requests)
    # Then the first and third are claimed with their shared locks; the second is deferred, with
    # the token and attempt it had, no lock row and no claim event
    assert [o.lease is not None for o in outcomes] == [True, False, True]
    assert outcomes[1].deferred and outcomes[1].locked and "locked by item" in outcomes[1].reason
    with Session(engine) as s:
        second = s.get(Item, items[1][0])
        assert second is not None
        state = (second.state, second.fencing_token, second.attempt, second.lease_owner)
        assert state == ("pending", 0, 0, None)
        held = s.execute(select(PhotoLock.item_id, PhotoLock.mode)).all()
    assert sorted(held) == sorted([(exif_item, "X"), (items[0][0], "S"), (items[2][0], "S")])
    assert events_of(engine, "item_claimed", items[1][0]) == []
    [deferred] = events_of(engine, "item_deferred", items[1][0])
    assert deferred.detail["held_by"] == exif_item  # type: ignore[index]


@contextmanager
def meeting_after_the_first_photo_lock(
    engine: Engine, marks: tuple[str, ...] = ("FROM photos",)
) -> Iterator[threading.Barrier]:
    """Each thread, right after its first statement that locks photo rows (``FOR UPDATE`` on a
    statement with one of ``marks``, or an ``UPDATE photos``), waits (3 s at most) for the other
    to have run its own: the interleaving that deadlocks two transactions that lock their photos
    one at a time in crossed orders."""
    barrier = threading.Barrier(2)
    seen = threading.local()

    def locks_photos(statement: str) -> bool:
        if statement.lstrip().startswith("UPDATE photos"):
            return "UPDATE photos" in marks
        return "FOR UPDATE" in statement and any(m in statement for m in marks)

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if locks_photos(statement) and not getattr(seen, "done", False):
            seen.done = True
            try:
                barrier.wait(timeout=3)
            except threading.BrokenBarrierError:
                pass  # the other is blocked on a lock this one holds: go on and commit

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield barrier
    finally:
        event.remove(engine, "after_cursor_execute", after)


def test_two_batches_with_crossed_photo_orders_claim_without_a_deadlock(
    engine: Engine, tmp_path: Path
) -> None:
    # Given two jobs over the same two photos, whose items come in crossed photo orders
    p1, p2 = tmp_path / "one.jpg", tmp_path / "two.jpg"
    first = queued(engine, ANALYSIS, [p1, p2])
    second = queued(engine, ANALYSIS, [p2, p1])
    assert [p for _, _, p in first] == list(reversed([p for _, _, p in second]))
    request = LockRequest(SHARED, 0.5)
    errors: list[BaseException] = []
    claimed: list[int] = []

    def claim(items: list[tuple[int, int, int]], worker: str) -> None:
        try:
            outcomes = store_items.claim_batch(
                engine, ANALYSIS, [(i, t) for i, t, _ in items], worker, {i: request for i, _, _ in items}
            )
            claimed.extend(o.lease.item_id for o in outcomes if o.lease is not None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # When two workers claim them as two batches at once, meeting after their first photo lock
    with meeting_after_the_first_photo_lock(engine):
        threads = [threading.Thread(target=claim, args=(b, w)) for b, w in ((first, "w1"), (second, "w2"))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    # Then neither transaction failed (no deadlock) and all four items hold their shared locks
    assert errors == [], errors
    assert sorted(claimed) == sorted(i for i, _, _ in first + second)


def test_two_batch_finishes_with_crossed_photo_orders_commit_without_a_deadlock(
    engine: Engine, tmp_path: Path
) -> None:
    # Given two claimed analysis batches over the same two photos, in crossed photo orders
    p1, p2 = tmp_path / "one.jpg", tmp_path / "two.jpg"
    batches = [queued(engine, ANALYSIS, [p1, p2]), queued(engine, ANALYSIS, [p2, p1])]
    request = LockRequest(SHARED, 0.5)
    leases = []
    for items in batches:
        outcomes = store_items.claim_batch(
            engine, ANALYSIS, [(i, t) for i, t, _ in items], "w", {i: request for i, _, _ in items}
        )
        leases.append([o.lease for o in outcomes if o.lease is not None])
    assert [len(b) for b in leases] == [2, 2]
    errors: list[BaseException] = []

    def finish(batch: list[store_items.Lease]) -> None:
        """As ``LeaseMiddleware.finish_batch`` does for analysis successes: each item's fenced
        success with its photo's hash, in (job, item) order, in one transaction."""
        try:
            with fenced_batch(engine, [lease.item_id for lease in batch]) as s:
                store_items.lock_batch_finish(s, batch)
                for lease in batch:
                    photo = lease.photo_id
                    write = [lambda s, photo=photo: set_photo_hash(s, photo, "ab" * 32, 1)]
                    store_items.succeed(s, lease, {"ok": True}, "w", write)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # When both finish at once, meeting after their first photo row lock
    with meeting_after_the_first_photo_lock(engine, ("UPDATE photos", "FROM photos")):
        threads = [threading.Thread(target=finish, args=(b,)) for b in leases]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    # Then neither failed, every item succeeded once, and no photo lock is left
    assert errors == [], errors
    with Session(engine) as s:
        states = s.execute(select(Item.state).where(Item.lane == "analysis")).scalars().all()
        assert set(states) == {"succeeded"} and s.execute(select(PhotoLock)).first() is None


def backend_waits_for_a_lock(engine: Engine, deadline: float = 5.0) -> bool:
    """PostgreSQL: poll (with a deadline) until some backend of this test's own database (not another
    test's, on the same server) waits for a row or transaction lock."""
    probe = (
        select(func.count())
        .select_from(text("pg_stat_activity"))
        .where(text("wait_event_type = 'Lock' AND datname = current_database()"))
    )
    end = time.monotonic() + deadline
    with engine.connect() as conn:
        while time.monotonic() < end:
            if conn.execute(probe).scalar_one():
                return True
            conn.rollback()
            time.sleep(0.01)
    return False


def test_a_cancel_meeting_a_batch_claim_midway_does_not_deadlock(engine: Engine, tmp_path: Path) -> None:
    # Given a job's two queued no-op items A < B, whose rows lie in the table (and in its indexes'
    # ties) in the order B, A: updates move rows (A went pending and queued again), so a cancel
    # that locks rows in the order it finds them meets B first
    [(a, token_a, _), (b, token_b, _)] = queued(engine, NOOP, [tmp_path / "a.jpg", tmp_path / "b.jpg"])
    with Session(engine) as s, s.begin():
        for state in ("pending", "queued"):
            s.execute(update(Item).where(Item.id == a).values(state=state))
        job = s.execute(select(Item.job_id).where(Item.id == a)).scalar_one()
        if engine.dialect.name == "postgresql":
            heap = s.execute(select(Item.id).where(Item.job_id == job).order_by(text("ctid"))).scalars().all()
            assert heap == [b, a]
    barrier = threading.Barrier(2)
    claiming = threading.local()
    errors: list[BaseException] = []
    outcomes: list[store_items.ClaimOutcome] = []
    cancelled: list[int] = []

    def after(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        """The batch claim, right after its first compare-and-set (item A locked), lets the cancel
        start and waits until it is blocked on a lock (PostgreSQL), then goes on to B."""
        if getattr(claiming, "on", False) and "SET state = 'running'" in statement:
            claiming.on = False
            barrier.wait(timeout=5)
            if engine.dialect.name == "postgresql":
                assert backend_waits_for_a_lock(engine), "the cancel never waited for the claim"

    def claim() -> None:
        claiming.on = True
        try:
            outcomes.extend(store_items.claim_batch(engine, NOOP, [(a, token_a), (b, token_b)], "w", {}))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def cancel() -> None:
        try:
            barrier.wait(timeout=5)
            cancelled.append(store_jobs.cancel(engine, job))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # When the job is cancelled while a worker's batch claim holds A and has not reached B
    event.listen(engine, "after_cursor_execute", after)
    try:
        threads = [threading.Thread(target=claim), threading.Thread(target=cancel)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        event.remove(engine, "after_cursor_execute", after)
    # Then neither transaction failed (no deadlock); the claim came first and holds both items,
    # which the cancel asks to stop (none of them cancelled outright)
    assert errors == [], errors
    assert [o.lease is not None for o in outcomes] == [True, True]
    assert cancelled == [0]
    with Session(engine) as s:
        assert set(s.execute(select(Item.state).where(Item.job_id == job)).scalars()) == {"running"}


def test_a_batch_takes_its_photo_locks_as_one_after_another_would(
    engine: Engine, tmp_path: Path, monkeypatch: Any
) -> None:
    # Given items over four photos (three jobs of the analysis lane: three items per photo) and,
    # in each of 40 random scenes, lock rows held by some of them (shared or exclusive) and a batch
    # of others asking for their photos, each shared or exclusive (two may ask for one photo)
    import random

    from store import photo_locks
    from store.photo_locks import lock_photo_rows, take, take_many

    paths = [tmp_path / f"p{i}.jpg" for i in range(4)]
    items = [item for _ in range(3) for item in queued(engine, ANALYSIS, paths)]

    def locks(conn: Any) -> list[tuple[Any, ...]]:
        rows = conn.execute(text("SELECT photo_id, item_id, mode, token FROM photo_locks"))
        return sorted(tuple(r) for r in rows)

    for seed in range(40):
        rnd = random.Random(seed)
        chosen = rnd.sample(items, 8)
        holders, batch = chosen[:3], chosen[3:]
        held = [(photo, item, rnd.choice([SHARED, EXCLUSIVE])) for item, _, photo in holders]
        wanted = [
            (item, (photo,), LockRequest(rnd.choice([SHARED, EXCLUSIVE]), 1.0), 7) for item, _, photo in batch
        ]
        if seed % 5 == 0:  # an item of the batch holds a row of an earlier attempt: taken over
            held.append((batch[0][2], batch[0][0], SHARED))
        outcomes = []
        for together in (False, True):
            with engine.connect() as conn, conn.begin() as tx:
                for photo, item, mode in held:
                    insert = "INSERT INTO photo_locks (photo_id, item_id, mode, token) VALUES (:p, :i, :m, 1)"
                    conn.execute(text(insert), {"p": photo, "i": item, "m": mode})
                # When the batch takes its locks together, and (the reference) one item after another
                # (every photo's row locked first in ascending id, as the batch claim does: the
                # reference's own row locks, one item at a time, would cross that order)
                if conn.dialect.name == "postgresql":
                    lock_photo_rows(conn, [p for _, ids, _, _ in wanted for p in ids])
                if together:
                    refused = set(take_many(conn, wanted))
                else:
                    with monkeypatch.context() as m:
                        m.setattr(photo_locks, "lock_photo_rows", lambda conn, ids: {})
                        refused = {i for i, ids, req, token in wanted if take(conn, i, ids, req, token)}
                outcomes.append((refused, locks(conn)))
                tx.rollback()
        # Then the same items are refused and the same lock rows are left
        assert outcomes[0] == outcomes[1], (seed, held, wanted)


def test_a_batch_finish_writes_every_photo_hash_and_lock_release_as_one_after_another_would(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a claimed analysis batch of three photos, the second item with an unsettled intent
    from store import intents
    from store.models import Intent, Photo

    paths = [tmp_path / f"p{i}.jpg" for i in range(3)]
    items = queued(engine, ANALYSIS, paths)
    request = LockRequest(SHARED, 0.5)
    requests = dict.fromkeys([i for i, _, _ in items], request)
    outcomes = store_items.claim_batch(engine, ANALYSIS, [(i, t) for i, t, _ in items], "w", requests)
    leases = [o.lease for o in outcomes if o.lease is not None]
    assert len(leases) == 3
    with Session(engine) as s, s.begin():
        intent = intents.record(
            s, leases[1], kind="write", staged=str(tmp_path / "s"), target=str(paths[1]), source=None,
            sha256="cd" * 32, worker="w",
        )  # fmt: skip
    # When the batch finishes, each item's success with its photo's hash, in one transaction
    statements: list[str] = []
    listen = lambda *a: statements.append(a[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listen)
    try:
        with fenced_batch(engine, [lease.item_id for lease in leases]) as s:
            store_items.lock_batch_finish(s, leases)
            for n, lease in enumerate(leases):
                write = [lambda s, photo=lease.photo_id, n=n: set_photo_hash(s, photo, f"{n:064d}", 10 + n)]
                store_items.succeed(s, lease, {"n": n}, "w", write)
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    # Then every photo has its own hash and size, the first and third items' lock rows are gone and
    # the second's are handed to its intent
    with Session(engine) as s:
        hashes = s.execute(select(Photo.id, Photo.sha256, Photo.size).order_by(Photo.id)).all()
        held = s.execute(select(PhotoLock.item_id, PhotoLock.intent_id)).all()
        assert s.get(Intent, intent) is not None
    assert [(h.sha256, h.size) for h in hashes] == [(f"{n:064d}", 10 + n) for n in range(3)]
    assert held == [(leases[1].item_id, intent)]
    # And the photos' rows were written by one statement, the three items' releases by one more
    assert sum(s.lstrip().startswith("UPDATE photos") for s in statements) == 1, statements
    assert sum(s.lstrip().startswith("DELETE FROM photo_locks WHERE item_id IN") for s in statements) == 1
