"""The store's paths take their row locks in the global order (issue 22): jobs -> items (ascending)
-> photos (ascending) -> intents -> photo_locks. Races made with statement hooks on PostgreSQL
(SQLite serializes whole write transactions, so the deadlock cannot happen there); the checker
(``store.lockdep``, on for every test) fails any test whose transactions still lock out of order.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store import lockdep
from store.engine import make_engine
from store.fencing import fenced
from store.intents import item_intents, record, settle_orphans
from store.lanes import lane_spec
from store.models import Item, Photo, PhotoLock
from tests.support import wait_for

NOOP = lane_spec("noop", env={})
RENAME = lane_spec("rename", env={})
ARCHIVE = lane_spec("archive", env={})


def _item(engine: Engine, job_id: int) -> Item:
    with Session(engine) as s:
        return s.execute(select(Item).where(Item.job_id == job_id)).scalar_one()


def _failed_after_landed_move(engine: Engine, photo: Path, target: Path) -> int:
    """A one-photo rename job whose item recorded a move of ``photo`` to ``target``, the move
    landed on disk, and the item then failed for good: a stopped item whose recorded intent (and
    the photo-lock rows it holds) the sweeper must settle. Its item id."""
    job = store_jobs.submit(engine, [RENAME], [store_jobs.PhotoInput(str(photo), photo.stat().st_size)])
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
        with engine.connect() as monitor:

            def claim_waits() -> bool:
                waiting = monitor.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                        " AND wait_event_type = 'Lock'"
                    )
                ).scalar_one()
                monitor.rollback()
                return bool(waiting)

            wait_for(claim_waits, what="the bundle claim to wait for a photo row lock")
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
