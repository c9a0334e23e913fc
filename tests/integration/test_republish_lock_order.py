"""The sweeper's re-publish takes its locks in the one order (job -> item), so it never deadlocks
with a cancel or pause on PostgreSQL (found by the photo chaos run once prefetched messages of
frozen workers made re-publishing common); a dispatch takes its items' photos in ascending id, so
it never deadlocks with a submission locking them (found by the long photo chaos run, 2026-12-05)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from sqlalchemy import Connection, Engine, select, update
from sqlalchemy.orm import Session

from store import control as store_control
from store import jobs as store_jobs
from store.dispatch import mark_republished, take_for_dispatch
from store.engine import make_engine
from store.items import claim_failed
from store.lanes import lane_spec
from store.models import Item, Job, Photo
from store.queries import job_for_change
from tests.support import photo_inputs, wait_for, waiting_for_a_lock

NOOP = lane_spec("noop", env={})


def race_with_a_holder(
    engine: Engine,
    hold: Callable[[Connection], object],
    action: Callable[[], object],
    then: Callable[[Connection], object],
    what: str,
) -> tuple[BaseException | None, dict[str, object]]:
    """A transaction takes a lock (``hold``); ``action`` runs in a thread meanwhile; once it waits
    for a lock (``what`` it waits for), the transaction goes on (``then``) and commits. Returns the
    transaction's error (a deadlock) and the action's outcome (``result``/``error``)."""
    holder = engine.connect()
    tx = holder.begin()
    hold(holder)
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["result"] = action()
        except Exception as exc:  # noqa: BLE001 - reported to the caller
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    wait_for(lambda: waiting_for_a_lock(engine) >= 1, 30, what=what)
    holder_error = None
    try:
        then(holder)
        tx.commit()
    except Exception as exc:  # noqa: BLE001 - the caller's assertion names it
        holder_error = exc
        tx.rollback()
    holder.close()
    worker.join(60)
    return holder_error, outcome


def race_with_a_cancel(
    engine: Engine, job: int, items: list[int], action: Callable[[], object]
) -> tuple[BaseException | None, dict[str, object]]:
    """A cancel-like transaction holds the job row (FOR UPDATE); ``action`` runs in a thread
    meanwhile; once it waits for a lock the cancel updates ``items`` (in ascending id, the global
    order, as a cancel does) and commits: an action that locked any of them before waiting for the
    job deadlocks with it. Returns the cancel's error (a deadlock) and the action's outcome
    (``result``/``error``)."""

    def update_items(cancel: Connection) -> None:
        for item in sorted(items):
            cancel.execute(update(Item).where(Item.id == item).values(updated_at=Item.updated_at))

    return race_with_a_holder(
        engine,
        lambda cancel: cancel.execute(select(Job.id).where(Job.id == job).with_for_update()).all(),
        action,
        update_items,
        "the action to wait for the job (job -> item)",
    )


def test_republish_waits_for_a_cancel_holding_the_job_instead_of_deadlocking(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    try:
        # Given a job with two queued items A < B, and a cancel-like transaction that holds the job
        # row (FOR UPDATE)
        photos = photo_inputs(tmp_path, 2)
        job = store_jobs.submit(engine, [NOOP], photos).job_id
        a, b = sorted(take_for_dispatch(engine, NOOP), key=lambda p: p.item_id)
        # When the sweeper re-publishes A and B meanwhile (it has to wait for the cancel), and the
        # cancel goes on to update A and B, then commits
        cancel_error, outcome = race_with_a_cancel(
            engine, job, [a.item_id, b.item_id], lambda: mark_republished(engine, [a, b], "test")
        )
        # Then neither was aborted as a deadlock: the re-publish waited and then did its work
        assert cancel_error is None, cancel_error
        assert "error" not in outcome, outcome.get("error")
        assert [p.item_id for p in outcome["result"]] == [a.item_id, b.item_id]  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_a_failed_claim_waits_for_a_cancel_holding_the_job_instead_of_deadlocking(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    try:
        # Given a queued item A and a cancel-like transaction that holds A's job row (FOR UPDATE)
        photos = [store_jobs.PhotoInput(str(tmp_path / "p.jpg"), 1)]
        job = store_jobs.submit(engine, [NOOP], photos).job_id
        [a] = take_for_dispatch(engine, NOOP)
        # When a worker records a deterministic claim error for A meanwhile (it has to wait), and
        # the cancel goes on to update A, then commits
        cancel_error, outcome = race_with_a_cancel(
            engine,
            job,
            [a.item_id],
            lambda: claim_failed(engine, NOOP, a.item_id, a.token, "boom", "w", counts=True),
        )
        # Then neither was aborted as a deadlock (the item was locked after its job, not before)
        assert cancel_error is None, cancel_error
        assert "error" not in outcome, outcome.get("error")
        assert outcome["result"] == "pending"
    finally:
        engine.dispose()


def test_a_dispatch_waits_for_a_cancel_holding_the_job_instead_of_deadlocking(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    try:
        # Given a job with two pending items A < B, and a cancel-like transaction that holds the job
        # row (FOR UPDATE)
        photos = photo_inputs(tmp_path, 2)
        job = store_jobs.submit(engine, [NOOP], photos).job_id
        with engine.connect() as conn:
            a, b = sorted(conn.execute(select(Item.id).where(Item.job_id == job)).scalars())
        # When the dispatcher takes A and B meanwhile (it has to wait for the cancel), and the cancel
        # goes on to update A and B, then commits
        dispatch = lambda: take_for_dispatch(engine, NOOP)  # noqa: E731
        cancel_error, outcome = race_with_a_cancel(engine, job, [a, b], dispatch)
        # Then neither was aborted as a deadlock: the dispatch locked the job before the items, waited,
        # and then queued both (a dispatch that locks the items first deadlocks here)
        assert cancel_error is None, cancel_error
        assert "error" not in outcome, outcome.get("error")
        assert sorted(p.item_id for p in outcome["result"]) == [a, b]  # type: ignore[attr-defined]
    finally:
        engine.dispose()


def test_a_change_of_a_job_does_not_deadlock_with_a_transaction_updating_its_item_twice(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    try:
        # Given a job with an item A, and a control transaction (cancel, pause, resume, retry,
        # discard) holding the job row as they lock it
        job = store_jobs.submit(engine, [NOOP], photo_inputs(tmp_path, 1)).job_id
        with engine.connect() as conn:
            (a,) = conn.execute(select(Item.id).where(Item.job_id == job)).scalars()
        control = engine.connect()
        tx = control.begin()
        control.execute(job_for_change(job)).all()
        outcome: dict[str, object] = {}

        def twice() -> None:
            # When another transaction updates A twice (its second UPDATE's foreign-key check takes
            # KEY SHARE on the job, after A's row lock), as a dispatch or a finish may
            try:
                with engine.begin() as conn:
                    for _ in range(2):
                        conn.execute(update(Item).where(Item.id == a).values(updated_at=Item.updated_at))
                outcome["done"] = True
            except Exception as exc:  # noqa: BLE001 - reported to the test
                outcome["error"] = exc

        other = threading.Thread(target=twice)
        other.start()
        wait_for(lambda: "done" in outcome or waiting_for_a_lock(engine) >= 1, 30, what="the other one")
        # And the control transaction then updates A and commits
        control_error = None
        try:
            control.execute(update(Item).where(Item.id == a).values(updated_at=Item.updated_at))
            tx.commit()
        except Exception as exc:  # noqa: BLE001 - the assertion names it
            control_error = exc
            tx.rollback()
        control.close()
        other.join(60)
        # Then neither was aborted as a deadlock (a job lock taken FOR UPDATE deadlocks here)
        assert control_error is None, control_error
        assert outcome == {"done": True}, outcome
    finally:
        engine.dispose()


def lock_photo(photo: int) -> Callable[[Connection], object]:
    """What a submission does to a photo it knows before its upsert: lock it FOR UPDATE."""
    return lambda c: c.execute(select(Photo.id).where(Photo.id == photo).with_for_update()).all()


def test_a_dispatch_takes_its_photos_in_ascending_id_so_a_submission_locking_them_does_not_deadlock(
    pg_url: str, tmp_path: Path
) -> None:
    engine = make_engine(pg_url)
    batch = replace(NOOP, threads=1, fleet_processes=1, batch=16)
    try:
        # Given a job whose first item's photo has the higher photo id (p1 was known before p0: an
        # earlier, cancelled job named it), so its items' order is the photos' descending order
        p0, p1 = photo_inputs(tmp_path, 2)
        earlier = store_jobs.submit(engine, [batch], [p1]).job_id
        store_control.cancel(engine, earlier)
        job = store_jobs.submit(engine, [batch], [p0, p1]).job_id
        with Session(engine) as s:
            photo_of = dict(s.execute(select(Item.id, Item.photo_id).where(Item.job_id == job)).all())
        first, second = sorted(photo_of)
        assert photo_of[first] > photo_of[second], "the items' order is the photos' descending order"
        low, high = sorted(photo_of.values())
        # And a submission-like transaction that holds the lower photo (FOR UPDATE, as
        # store.submission locks the photos it knows, in ascending id)
        # When the dispatcher queues both items in one message meanwhile (it has to wait for the
        # lower photo), and the submission goes on to lock the higher photo, then commits
        submit_error, outcome = race_with_a_holder(
            engine, lock_photo(low), lambda: take_for_dispatch(engine, batch), lock_photo(high),
            "the dispatch to wait for a photo",
        )  # fmt: skip
        # Then neither was aborted as a deadlock: the dispatch had taken no photo before the lower
        # one, waited, and then queued both items in one message
        assert submit_error is None, submit_error
        assert "error" not in outcome, outcome.get("error")
        assert sorted(p.item_id for p in outcome["result"]) == [first, second]  # type: ignore[attr-defined]
    finally:
        engine.dispose()
