"""The store's paths take their row locks in the global order (issue 22): jobs -> items (ascending)
-> photos (ascending) -> intents -> photo_locks. Races made with statement hooks on PostgreSQL
(SQLite serializes whole write transactions, so the deadlock cannot happen there); the checker
(``store.lockdep``, on for every test) fails any test whose transactions still lock out of order.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, update
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store import lockdep
from store.engine import make_engine
from store.fencing import fenced, fenced_batch
from store.intents import item_intents, record, set_photo_hash, settle_orphans
from store.lanes import lane_spec
from store.models import Event, Item, Photo, PhotoLock
from store.sweeper import revoke_expired
from tests.support import photo_inputs, wait_for, waiting_for_a_lock

NOOP = lane_spec("noop", env={})
RENAME = lane_spec("rename", env={})
ARCHIVE = lane_spec("archive", env={})
ANALYSIS = lane_spec("analysis", env={})  # a shared photo lock, batch messages
EXIF = lane_spec("exif", env={})
ONE_ATTEMPT = lane_spec("exif", env={"PHOTOJOBS_MAX_ATTEMPTS": "1"})


@pytest.fixture
def checked(pg_url: str, tmp_path: Path) -> Iterator[tuple[Engine, Path]]:
    """A PostgreSQL engine checked by the lock-order checker, and the folder its violations go to:
    the session's (tests/conftest.py sets PHOTOJOBS_LOCKDEP and clears it for each test), or, with
    the checker turned off for the session, one installed here."""
    folder = os.environ.get(lockdep.ENV)
    eng = make_engine(pg_url)
    if not folder:
        folder = str(tmp_path / "lockdep")
        lockdep.install(eng, folder)
    yield eng, Path(folder)
    eng.dispose()


def table_order_violations(folder: Path) -> list[str]:
    """The table-order violations recorded in ``folder``, readable."""
    return [
        lockdep.format_violation(v)
        for v in lockdep.read_violations(str(folder))
        if any(p.startswith("table order") for p in v["problems"])
    ]


def _items_at(engine: Engine, job_id: int, position: int) -> list[Item]:
    with Session(engine) as s:
        return list(
            s.execute(select(Item).where(Item.job_id == job_id, Item.position == position).order_by(Item.id))
            .scalars()
            .all()
        )


def _event_types(engine: Engine, job_id: int) -> list[tuple[str, int]]:
    with Session(engine) as s:
        rows = s.execute(
            select(Event.type, Event.item_id).where(Event.job_id == job_id).order_by(Event.id)
        ).all()
    return [(r.type, r.item_id) for r in rows]


def _claimed(engine: Engine, spec: Any, item: Item) -> store_items.Lease:
    lease = store_items.claim(engine, spec, item.id, item.fencing_token, "w").lease
    assert lease is not None and lease.holds_locks
    return lease


def test_a_middle_lane_succeed_with_its_photo_hash_locks_in_the_global_order(
    checked: tuple[Engine, Path], tmp_path: Path
) -> None:
    """Given an analysis item (then exif) holding its shared photo lock; when it succeeds, writing
    its photo's hash; then no row was locked against the order (the old finish made the exif item
    ready after its photo and photo-lock rows), the exif item is ready after the success."""
    engine, folder = checked
    job = store_jobs.submit(engine, [ANALYSIS, EXIF], photo_inputs(tmp_path, 1)).job_id
    [first] = _items_at(engine, job, 0)
    lease = _claimed(engine, ANALYSIS, first)
    with fenced(engine, lease.item_id, lease.token, worker="w", what="succeed") as s:
        hashed = [lambda s: set_photo_hash(s, lease.photo_id or 0, "ab" * 32, 1)]
        store_items.succeed(s, lease, {"sha256": "ab" * 32}, "w", hashed)
    assert table_order_violations(folder) == []
    [nxt] = _items_at(engine, job, 1)
    assert nxt.state == "pending"
    events = _event_types(engine, job)
    assert events.index(("item_succeeded", first.id)) < events.index(("item_ready", nxt.id))


def test_the_last_item_before_a_bundle_releases_it_in_the_global_order(
    checked: tuple[Engine, Path], tmp_path: Path
) -> None:
    """Given two analysis items before an archive bundle over both photos; when both succeed, one
    after the other; then no row was locked against the order (the old finish locked the bundle
    after its photo-lock rows) and the bundle is ready once, after the second success."""
    engine, folder = checked
    photos = photo_inputs(tmp_path, 2)
    job = store_jobs.submit(engine, [ANALYSIS, ARCHIVE], photos, bundle_lanes=["archive"]).job_id
    analysed = _items_at(engine, job, 0)
    leases = [_claimed(engine, ANALYSIS, item) for item in analysed]
    for lease in leases:
        with fenced(engine, lease.item_id, lease.token, worker="w", what="succeed") as s:
            store_items.succeed(s, lease, None, "w")
    assert table_order_violations(folder) == []
    [bundle] = _items_at(engine, job, 1)
    assert bundle.state == "pending"
    events = _event_types(engine, job)
    assert events.count(("item_ready", bundle.id)) == 1
    assert events.index(("item_succeeded", analysed[1].id)) < events.index(("item_ready", bundle.id))


def test_a_failure_for_good_skips_the_next_lanes_in_the_global_order(
    checked: tuple[Engine, Path], tmp_path: Path
) -> None:
    """Given an exif item (then rename, which needs it) holding its photo lock; when it fails for
    good; then no row was locked against the order (the old failure skipped the next item after
    dropping its photo-lock rows), the rename item is skipped after the failure and no lock row
    is left."""
    engine, folder = checked
    job = store_jobs.submit(engine, [EXIF, RENAME], photo_inputs(tmp_path, 1)).job_id
    [first] = _items_at(engine, job, 0)
    lease = _claimed(engine, EXIF, first)
    with fenced(engine, lease.item_id, lease.token, worker="w", what="fail") as s:
        store_items.fail(s, EXIF, lease, "unreadable", "w", retry=False)
    assert table_order_violations(folder) == []
    [nxt] = _items_at(engine, job, 1)
    assert nxt.state == "skipped"
    events = _event_types(engine, job)
    assert events.index(("item_failed", first.id)) < events.index(("item_skipped", nxt.id))
    with Session(engine) as s:
        assert s.execute(select(PhotoLock)).first() is None


def test_a_batch_finish_of_a_middle_lane_locks_in_the_global_order(
    checked: tuple[Engine, Path], tmp_path: Path
) -> None:
    """Given two analysis items (then exif) claimed as one batch; when the batch succeeds in one
    transaction, each with its photo's hash; then no row was locked against the order (the old
    batch finish made the exif items ready after the photos it had locked) and both exif items
    are ready."""
    engine, folder = checked
    job = store_jobs.submit(engine, [ANALYSIS, EXIF], photo_inputs(tmp_path, 2)).job_id
    analysed = _items_at(engine, job, 0)
    request = store_items.lane_lock_request(ANALYSIS)
    outcomes = store_items.claim_batch(
        engine, ANALYSIS, [(i.id, i.fencing_token) for i in analysed], "w", {i.id: request for i in analysed}
    )
    leases = [o.lease for o in outcomes if o.lease is not None]
    assert len(leases) == 2
    with fenced_batch(engine, [lease.item_id for lease in leases]) as s:
        store_items.lock_batch_finish(s, leases)
        for lease in leases:
            hashed = [lambda s, photo=lease.photo_id: set_photo_hash(s, photo or 0, "cd" * 32, 1)]
            store_items.succeed(s, lease, None, "w", hashed)
    assert table_order_violations(folder) == []
    assert [i.state for i in _items_at(engine, job, 1)] == ["pending", "pending"]


def test_a_sweeper_quarantine_skips_the_next_lanes_in_the_global_order(
    checked: tuple[Engine, Path], tmp_path: Path
) -> None:
    """Given two exif items (then rename, which needs them) on their last attempt, holding their
    photo locks, whose leases expired (their worker died); when the sweeper revokes both in one
    pass, quarantining them; then no row was locked against the order (the old pass skipped an
    item's successors after dropping photo-lock rows), both rename items are skipped and no lock
    row is left."""
    engine, folder = checked
    job = store_jobs.submit(engine, [EXIF, RENAME], photo_inputs(tmp_path, 2)).job_id
    analysed = _items_at(engine, job, 0)
    for item in analysed:
        _claimed(engine, ONE_ATTEMPT, item)
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id.in_([i.id for i in analysed])).values(lease_expires_at=0.0))
    revoked, quarantined = revoke_expired(engine, {"exif": ONE_ATTEMPT})
    assert (revoked, quarantined) == (2, 2)
    assert table_order_violations(folder) == []
    assert [i.state for i in _items_at(engine, job, 1)] == ["skipped", "skipped"]
    with Session(engine) as s:
        assert s.execute(select(PhotoLock)).first() is None


def _item(engine: Engine, job_id: int) -> Item:
    with Session(engine) as s:
        return s.execute(select(Item).where(Item.job_id == job_id)).scalar_one()


def _failed_after_landed_move(engine: Engine, photo: Path, target: Path) -> int:
    """A one-photo rename job whose item recorded a move of ``photo`` to ``target``, the move
    landed on disk, and the item then failed for good: a stopped item whose recorded intent (and
    the photo-lock rows it holds) the sweeper must settle. Its item id."""
    # The job's root is the photos' folder, as every submitted job's is (photojobs.api): the sweeper
    # settles an intent from the disk only inside its job's roots (photos.rootfs.Roots).
    job = store_jobs.submit(
        engine, [RENAME], [store_jobs.PhotoInput(str(photo), photo.stat().st_size)], roots=[str(photo.parent)]
    )
    item = _item(engine, job.job_id)
    lease = store_items.claim(engine, RENAME, item.id, item.fencing_token, "w").lease
    assert lease is not None and lease.holds_locks
    digest = hashlib.sha256(photo.read_bytes()).hexdigest()
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        record(
            s,
            lease,
            kind="move",
            staged=str(target.with_name(f".{target.name}.staged")),
            target=str(target),
            source=str(photo),
            sha256=digest,
            base_sha256=digest,
            worker="w",
        )
    photo.rename(target)  # the move landed, then the worker failed the item
    with fenced(engine, lease.item_id, lease.token, worker="w") as s:
        store_items.fail(s, RENAME, lease, "stopped after its move", "w", retry=False)
    return item.id


def test_settle_orphans_does_not_deadlock_with_a_bundle_claim_over_the_same_photos(
    pg_url: str, tmp_path: Path
) -> None:
    """Given two failed rename items A < B whose landed moves are still recorded, A's photo having
    the higher id (photos in item order are not in photo-id order), and a bundle item (archive)
    over both photos; when the sweeper's settle_orphans has locked A's photo (paused there by a
    statement hook) and the bundle's claim locks the photos in ascending id and waits for A's;
    then, the sweeper resumed, neither raises (one transaction over A and B took B's photo — the
    lower id — while holding A's: DeadlockDetected), both intents settle as applied and the photos
    follow their files, and the claim is deferred by B's photo lock."""
    engine = make_engine(pg_url)
    sweeper_engine = make_engine(pg_url)
    paused, go = threading.Event(), threading.Event()
    try:
        folder = tmp_path / "photos"
        folder.mkdir()
        p1, p2 = folder / "p1.jpg", folder / "p2.jpg"
        p1.write_bytes(b"first photo")
        p2.write_bytes(b"second photo")
        # Photo ids in path order (p1 < p2), then A on p2 and B on p1: A < B but photo(A) > photo(B).
        store_jobs.submit(engine, [NOOP], [store_jobs.PhotoInput(str(p), 1) for p in (p1, p2)])
        bundle_job = store_jobs.submit(
            engine, [ARCHIVE], [store_jobs.PhotoInput(str(p), 1) for p in (p1, p2)], bundle_lanes=["archive"]
        )
        bundle = _item(engine, bundle_job.job_id)
        a = _failed_after_landed_move(engine, p2, folder / "renamed-p2.jpg")
        b = _failed_after_landed_move(engine, p1, folder / "renamed-p1.jpg")
        with Session(engine) as s:
            photo_of = dict(s.execute(select(Item.id, Item.photo_id).where(Item.id.in_([a, b]))).all())
        assert a < b and photo_of[a] > photo_of[b]

        # The sweeper pauses right after its first statement that locks a photo row.

        def hook(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if not paused.is_set() and any(lock.table == "photos" for lock in lockdep.classify(statement)):
                paused.set()
                go.wait(60)

        event.listen(sweeper_engine, "after_cursor_execute", hook)
        outcome: dict[str, Any] = {}

        def sweep() -> None:
            try:
                outcome["settled"] = settle_orphans(sweeper_engine)
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["sweep_error"] = exc

        def claim_bundle() -> None:
            try:
                outcome["claim"] = store_items.claim(engine, ARCHIVE, bundle.id, bundle.fencing_token, "w2")
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["claim_error"] = exc

        sweeper = threading.Thread(target=sweep)
        claimer = threading.Thread(target=claim_bundle)
        # When the sweeper holds A's photo and the bundle's claim waits for it
        sweeper.start()
        wait_for(paused.is_set, what="the sweeper to lock a photo row")
        claimer.start()
        wait_for(lambda: waiting_for_a_lock(engine), what="the bundle claim to wait for a photo row lock")
        go.set()
        sweeper.join(60)
        claimer.join(60)
        assert not sweeper.is_alive() and not claimer.is_alive()

        # Then nobody deadlocked: both intents settled, the photos follow their files
        assert "sweep_error" not in outcome, f"settle_orphans raised: {outcome['sweep_error']}"
        assert "claim_error" not in outcome, f"the bundle claim raised: {outcome['claim_error']}"
        assert outcome["settled"] == 2
        assert [i.state for i in item_intents(engine, a) + item_intents(engine, b)] == ["applied", "applied"]
        with Session(engine) as s:
            paths = dict(s.execute(select(Photo.id, Photo.path)).all())
            held = s.execute(select(PhotoLock.item_id)).scalars().all()
        assert paths[photo_of[a]] == str(folder / "renamed-p2.jpg")
        assert paths[photo_of[b]] == str(folder / "renamed-p1.jpg")
        # and the claim met B's photo lock (released only in B's transaction, after the claim's)
        claim = outcome["claim"]
        assert claim.lease is None and claim.locked, claim
        assert held == []
    finally:
        go.set()
        engine.dispose()
        sweeper_engine.dispose()


def test_a_fenced_photo_write_locks_its_item_first(checked: tuple[Engine, Path], tmp_path: Path) -> None:
    """Given an analysis item holding its lease; when a fenced session records its photo's hash
    without finishing the item (no finishing compare-and-set checks the fence first); then no row
    was locked against the order (the fence's item lock came at the commit, after the photo's row),
    and the hash is written. And when the lease has moved on, the same write is refused
    (``StaleLease``) and the hash is not written."""
    from store.errors import StaleLease

    engine, folder = checked
    job = store_jobs.submit(engine, [ANALYSIS], photo_inputs(tmp_path, 1)).job_id
    [item] = _items_at(engine, job, 0)
    lease = _claimed(engine, ANALYSIS, item)
    assert lease.photo_id is not None
    with fenced(engine, lease.item_id, lease.token, worker="w", what="hash") as s:
        set_photo_hash(s, lease.photo_id, "ef" * 32, 7)
    assert table_order_violations(folder) == []
    with Session(engine) as s:
        assert s.get(Photo, lease.photo_id).sha256 == "ef" * 32  # type: ignore[union-attr]
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id == item.id).values(fencing_token=lease.token + 1))
    with pytest.raises(StaleLease):
        with fenced(engine, lease.item_id, lease.token, worker="w", what="hash") as s:
            set_photo_hash(s, lease.photo_id, "00" * 32, 8)
    with Session(engine) as s:
        assert s.get(Photo, lease.photo_id).sha256 == "ef" * 32  # type: ignore[union-attr]


def test_a_sweeper_revocation_does_not_deadlock_with_a_batch_finish_before_a_bundle(
    pg_url: str, tmp_path: Path
) -> None:
    """Given two analysis items X < Y claimed as one batch, before an archive bundle over their
    photos (the bundle's id is the lowest), Y's lease expired; when the sweeper's revocation has
    locked Y (paused there by a statement hook) and the batch's finish locks the bundle, X and Y
    in ascending id and waits for Y; then, the sweeper resumed, nobody deadlocks (a sweeper that
    locked what a quarantine skips — the bundle — after Y waited for the finish that waited for
    it): the sweeper revokes Y, the batch finish is refused as stale or commits."""
    from store.errors import StaleLease

    engine = make_engine(pg_url)
    sweeper_engine = make_engine(pg_url)
    paused, go = threading.Event(), threading.Event()
    try:
        photos = photo_inputs(tmp_path, 2)
        job = store_jobs.submit(engine, [ANALYSIS, ARCHIVE], photos, bundle_lanes=["archive"]).job_id
        analysed = _items_at(engine, job, 0)
        [bundle] = _items_at(engine, job, 1)
        assert bundle.id < analysed[0].id < analysed[1].id
        request = store_items.lane_lock_request(ANALYSIS)
        pairs = [(i.id, i.fencing_token) for i in analysed]
        outcomes = store_items.claim_batch(engine, ANALYSIS, pairs, "w", {i.id: request for i in analysed})
        leases = [o.lease for o in outcomes if o.lease is not None]
        assert len(leases) == 2
        y = analysed[1].id
        with Session(engine) as s, s.begin():
            s.execute(update(Item).where(Item.id == y).values(lease_expires_at=0.0))

        def hook(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if not paused.is_set() and "SKIP LOCKED" in statement and "FROM items" in statement:
                paused.set()
                go.wait(60)

        event.listen(sweeper_engine, "after_cursor_execute", hook)
        outcome: dict[str, Any] = {}

        def sweep() -> None:
            try:
                outcome["revoked"] = revoke_expired(sweeper_engine, {"analysis": ANALYSIS})
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["sweep_error"] = exc

        def finish() -> None:
            try:
                with fenced_batch(engine, [lease.item_id for lease in leases]) as s:
                    store_items.lock_batch_finish(s, leases)
                    for lease in leases:
                        store_items.succeed(s, lease, None, "w")
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["finish_error"] = exc

        sweeper, finisher = threading.Thread(target=sweep), threading.Thread(target=finish)
        # When the sweeper holds Y and the batch finish waits for a row lock
        sweeper.start()
        wait_for(paused.is_set, what="the sweeper to lock the expired items")
        finisher.start()
        wait_for(lambda: waiting_for_a_lock(engine), what="the batch finish to wait for a row lock")
        go.set()
        sweeper.join(60)
        finisher.join(60)
        assert not sweeper.is_alive() and not finisher.is_alive()

        # Then nobody deadlocked: Y was revoked, the finish refused as stale (or it committed)
        assert "sweep_error" not in outcome, f"the sweeper raised: {outcome['sweep_error']}"
        error = outcome.get("finish_error")
        assert error is None or isinstance(error, StaleLease), f"the batch finish raised: {error}"
        assert outcome["revoked"] == (1, 0)
    finally:
        go.set()
        engine.dispose()
        sweeper_engine.dispose()
