"""Real races against the real store: concurrent claims, revocation vs. commit, cancel vs. finish/sweep.

Each race starts its contenders with a barrier so they run at the same instant; the assertions are
the invariants that must hold whatever the interleaving.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text, update
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.engine import make_engine
from store.errors import StaleLease
from store.events import emit
from store.fencing import FencedSession, fenced
from store.lanes import lane_spec
from store.models import Event, Item, Photo, PhotoLock
from store.sweeper import expired_leases, revoke_expired
from tests.support import wait_for

NOOP = lane_spec("noop", env={})
EXPIRED = replace(NOOP, lease_ttl=0.0, max_attempts=2)  # a lease that is expired as soon as it is taken


def _submit(
    engine: Engine, tmp_path: Path, n: int, lanes: list[Any] | None = None, bundle: tuple[str, ...] = ()
) -> int:
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(n)]
    return store_jobs.submit(engine, lanes or [NOOP], photos, bundle_lanes=bundle).job_id


def _item_ids(engine: Engine, job_id: int, lane: str = "noop") -> list[int]:
    with Session(engine) as s:
        return list(
            s.execute(
                select(Item.id).where(Item.job_id == job_id, Item.lane == lane).order_by(Item.id)
            ).scalars()
        )


def _claim_in_child(url: str, item_id: int, token: int, barrier: Any, out: Any, name: str) -> None:
    engine = make_engine(url)
    try:
        barrier.wait(60)
        outcome = store_items.claim(engine, NOOP, item_id, token, name)
        out.put((name, outcome.lease.token if outcome.lease else None, outcome.reason))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put((name, None, f"error: {type(exc).__name__}: {exc}"))
    finally:
        engine.dispose()


def test_two_processes_claiming_the_same_item_at_once_exactly_one_wins(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    # Given queued items, each delivered twice (a duplicated message)
    job = _submit(engine, tmp_path, 6)
    take_for_dispatch(engine, NOOP)
    ctx = mp.get_context("fork")
    for item_id in _item_ids(engine, job):
        barrier, out = ctx.Barrier(2), ctx.Queue()
        # When two worker processes claim it at the same instant
        procs = [
            ctx.Process(target=_claim_in_child, args=(db_url, item_id, 0, barrier, out, f"w{k}"))
            for k in range(2)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        # Then exactly one of them holds the lease (token 1), the other was told why not
        winners = [r for r in results if r[1] is not None]
        assert len(winners) == 1, results
        assert winners[0][1] == 1
        loser = next(r for r in results if r[1] is None)
        assert "stale token" in loser[2] or "not claimable" in loser[2], results
        with Session(engine) as s:
            row = s.get(Item, item_id)
            assert row is not None and row.state == "running" and row.lease_owner == winners[0][0]
            claimed = s.execute(
                select(Event).where(Event.item_id == item_id, Event.type == "item_claimed")
            ).all()
            assert len(claimed) == 1


def _photo_of(engine: Engine, item_id: int) -> int:
    with Session(engine) as s:
        row = s.get(Item, item_id)
        assert row is not None and row.photo_id is not None
        return row.photo_id


def _lease_has_expired(engine: Engine, item_id: int) -> bool:
    """Whether the sweeper sees the item's lease as expired now (its own query, database clock)."""
    with Session(engine) as s:
        return item_id in {r.id for r in s.execute(expired_leases(1000)).all()}


def test_revocation_racing_a_fenced_commit_never_lets_both_win(engine: Engine, tmp_path: Path) -> None:
    # Given claimed items whose leases have already expired (their holder is slow)
    job = _submit(engine, tmp_path, 8)
    sqlite = engine.dialect.name == "sqlite"
    outcomes: list[str] = []
    for n, item_id in enumerate(_item_ids(engine, job)):
        lease = store_items.claim(engine, EXPIRED, item_id, 0, "slow").lease
        assert lease is not None
        # (a TTL of 0 expires once the database clock has moved past the claim's instant)
        wait_for(lambda item_id=item_id: _lease_has_expired(engine, item_id), 5, 0.001, "the lease to expire")
        barrier = threading.Barrier(2, timeout=60)
        # Half the rounds the revocation wins the race, half the commit does: the loser waits for
        # the winner's commit (on SQLite, whose write lock is held from BEGIN, a revocation that
        # wins comes before the holder's transaction; on PostgreSQL, between its writes and commit)
        revocation_first = n % 2 == 0
        revoked, committed = threading.Event(), threading.Event()
        result: dict[str, Any] = {}

        def holder(
            lease: store_items.Lease = lease,
            result: dict[str, Any] = result,
            barrier: threading.Barrier = barrier,
            revocation_first: bool = revocation_first,
            revoked: threading.Event = revoked,
            committed: threading.Event = committed,
        ) -> None:
            # When the holder makes its fenced writes (an event row: no row of the lock order, which
            # its fence then locks first: jobs -> items -> photos), meets the sweeper, then commits …
            try:
                if sqlite and revocation_first:
                    barrier.wait()
                    assert revoked.wait(60)
                with fenced(engine, lease.item_id, lease.token, worker="slow") as s:
                    emit(s, "holder_wrote", item_id=lease.item_id)
                    s.flush()
                    if not (sqlite and revocation_first):
                        barrier.wait()
                    if revocation_first and not sqlite:
                        assert revoked.wait(60)
                result["holder"] = "committed"
            except StaleLease:
                result["holder"] = "stale"
            finally:
                committed.set()

        def sweeper(
            result: dict[str, Any] = result,
            barrier: threading.Barrier = barrier,
            revocation_first: bool = revocation_first,
            revoked: threading.Event = revoked,
            committed: threading.Event = committed,
        ) -> None:
            # … while a sweeper revokes the expired lease at the same instant
            barrier.wait()
            if not revocation_first:
                assert committed.wait(60)
            result["revoked"] = revoke_expired(engine, {"noop": EXPIRED})[0]
            revoked.set()

        threads = [threading.Thread(target=holder), threading.Thread(target=sweeper)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        # Then either the holder committed everything (the revocation came after), or it got
        # StaleLease and none of its writes is visible (the revocation came first)
        with Session(engine) as s:
            wrote = s.execute(
                select(Event).where(Event.type == "holder_wrote", Event.item_id == item_id)
            ).all()
            item = s.get(Item, item_id)
        assert item is not None and result["revoked"] == 1
        if result["holder"] == "stale":
            assert not wrote
            assert item.fencing_token == lease.token + 1
        else:
            assert len(wrote) == 1
        outcomes.append(result["holder"])
    # And both orders happened: the race was lost by the holder and by the sweeper in turn
    assert outcomes == ["stale", "committed"] * 4


def test_revocation_between_fenced_writes_and_commit_rolls_everything_back(
    pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL: the revocation lands after the holder's writes and before its commit (SQLite's
    BEGIN IMMEDIATE serializes whole transactions, so there it can only come before or after)."""
    engine = make_engine(pg_url)
    try:
        # Given a claimed item whose lease has expired, and a hook at the holder's commit boundary
        job = _submit(engine, tmp_path, 1)
        item_id = _item_ids(engine, job)[0]
        lease = store_items.claim(engine, EXPIRED, item_id, 0, "slow").lease
        assert lease is not None
        photo = _photo_of(engine, item_id)
        revoked: list[int] = []

        def revoke_now(session: FencedSession) -> None:
            t = threading.Thread(target=lambda: revoked.append(revoke_expired(engine, {"noop": EXPIRED})[0]))
            t.start()
            t.join(60)

        event.listen(FencedSession, "before_commit", revoke_now, insert=True)
        try:
            # When the holder writes, and the sweeper revokes the lease before the commit
            with pytest.raises(StaleLease):
                # (an event row only: a fenced photo write locks its item first — store.fencing.lock_fence —
                # so a revocation cannot land between it and the commit; the lock-order checker
                # refuses a photo row locked before the item)
                with fenced(engine, item_id, lease.token, worker="slow") as s:
                    emit(s, "holder_wrote", item_id=item_id, photo_id=photo)
        finally:
            event.remove(FencedSession, "before_commit", revoke_now)
        # Then the revocation happened, and none of the holder's writes was committed
        assert revoked == [1]
        with Session(engine) as s:
            assert not s.execute(select(Event).where(Event.type == "holder_wrote")).all()
            assert s.execute(
                select(Event).where(Event.type == "stale_commit_rejected", Event.item_id == item_id)
            ).all()
    finally:
        engine.dispose()


def _waits_for_a_lock(engine: Engine, pid: int) -> bool:
    """PostgreSQL: whether backend ``pid`` of this test's database waits for a lock right now."""
    with engine.connect() as c:
        return bool(
            c.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid "
                    "AND datname = current_database() AND wait_event_type = 'Lock'"
                ),
                {"pid": pid},
            ).scalar_one()
        )


class CancelWaitsForTheOthers:
    """The forced interleaving of one round: the finish thread stops after its first item's
    compare-and-set and the sweeper thread after locking its expired items (each mid-transaction,
    holding the job's share lock and item rows); the cancel thread starts once both hold, and they
    go on only when the cancel's backend waits for a lock (the job's row). Statement hooks on the
    engine, by thread role."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.roles: dict[int, str] = {}
        self.holding = {"finish": threading.Event(), "sweep": threading.Event()}
        self.cancel_pid: list[int] = []
        self.cancel_waited = threading.Event()

    def __enter__(self) -> CancelWaitsForTheOthers:
        event.listen(self.engine, "before_cursor_execute", self.before)
        event.listen(self.engine, "after_cursor_execute", self.after)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "before_cursor_execute", self.before)
        event.remove(self.engine, "after_cursor_execute", self.after)

    def role(self, role: str) -> None:
        self.roles[threading.get_ident()] = role

    def cancel_may_start(self) -> None:
        for held in self.holding.values():
            assert held.wait(60), "the finish and the sweeper never got mid-transaction"

    def before(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if self.roles.get(threading.get_ident()) == "cancel" and not self.cancel_pid:
            self.cancel_pid.append(conn.connection.dbapi_connection.info.backend_pid)

    def after(self, conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        role = self.roles.get(threading.get_ident())
        if role == "sweep" and "SKIP LOCKED" in statement and not self.holding["sweep"].is_set():
            self.hold("sweep")
        elif role == "finish" and "state = 'succeeded'" in statement and not self.holding["finish"].is_set():
            self.hold("finish")

    def hold(self, role: str) -> None:
        self.holding[role].set()
        wait_for(self.cancel_waits, 30, 0.01, "the cancel to wait for the job's row")
        self.cancel_waited.set()

    def cancel_waits(self) -> bool:
        """Whether the cancel's backend (of this test's database) waits for a lock right now."""
        if not self.cancel_pid:
            return False
        with self.engine.connect() as c:
            return bool(
                c.execute(
                    text(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = :pid "
                        "AND datname = current_database() AND wait_event_type = 'Lock'"
                    ),
                    {"pid": self.cancel_pid[0]},
                ).scalar_one()
            )


def test_cancel_racing_finish_and_sweeper_never_deadlocks(pg_url: str, tmp_path: Path) -> None:
    """PostgreSQL: ``cancel`` (job -> items) against finishing items that release a bundle and the
    sweeper's revoke/quarantine path, round after round, in a forced interleaving
    (``CancelWaitsForTheOthers``): the cancel waits for the job's row while the finish and the
    sweeper are mid-transaction and go on — the moment a path that locks a job after its items, or
    items out of order, would deadlock."""
    engine = make_engine(pg_url, pool_size=12)
    bundle_lane = replace(lane_spec("archive", env={}), lock="")
    second = replace(lane_spec("upload", env={}), lock="")
    errors: list[BaseException] = []
    try:
        for rnd in range(8):
            # Given a job noop -> upload (per photo) -> archive (one bundle) whose noop items are
            # all running: the first 24 with expired leases (all but the last two out of attempts,
            # so the sweeper locks many waiting successors before it reads the job), the last 8
            # about to finish (releasing successors and checking the bundle)
            job = _submit(engine, tmp_path / f"r{rnd}", 32, [EXPIRED, second, bundle_lane], ("archive",))
            ids = _item_ids(engine, job)
            leases = []
            for k, item_id in enumerate(ids):
                spec = EXPIRED if k < 24 else NOOP
                lease = store_items.claim(engine, spec, item_id, 0, "w").lease
                assert lease is not None
                leases.append((k, lease))
            with Session(engine) as s, s.begin():
                s.execute(update(Item).where(Item.id.in_(ids[:22])).values(attempt=2))
            forced = CancelWaitsForTheOthers(engine)

            def run(fn: Any, role: str, forced: CancelWaitsForTheOthers = forced) -> None:
                forced.role(role)
                try:
                    if role == "cancel":
                        forced.cancel_may_start()
                    fn()
                except BaseException as exc:  # noqa: BLE001 - collected for the assertion
                    errors.append(exc)

            def finish(leases: list[Any] = leases) -> None:
                for k, lease in leases:
                    if k >= 24:
                        try:
                            with fenced(engine, lease.item_id, lease.token, worker="w") as s:
                                store_items.succeed(s, lease, None, "w")
                        except StaleLease:
                            pass

            def sweep() -> None:
                revoke_expired(engine, {"noop": EXPIRED})

            def cancel(job: int = job) -> None:
                store_jobs.cancel(engine, job)

            # When cancel, the finishing items and the sweeper run in that interleaving
            with forced:
                threads = [
                    threading.Thread(target=run, args=(f, r))
                    for f, r in ((finish, "finish"), (sweep, "sweep"), (cancel, "cancel"))
                ]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(180)
            # Then the interleaving happened and nobody deadlocked (PostgreSQL would abort one
            # with DeadlockDetected)
            assert not errors, [f"{type(e).__name__}: {e}" for e in errors]
            assert forced.cancel_waited.is_set(), "the interleaving was not forced"
            status = store_jobs.job_status(engine, job)
            assert status.control == "cancel"
    finally:
        engine.dispose()


EXIF = lane_spec("exif", env={})  # exclusive photo locks


def _claim_exif_in_child(url: str, item_id: int, barrier: Any, out: Any, name: str) -> None:
    engine = make_engine(url)
    try:
        barrier.wait(60)
        outcome = store_items.claim(engine, EXIF, item_id, 0, name)
        out.put((name, item_id, outcome.lease is not None, outcome.reason))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        out.put((name, item_id, False, f"error: {type(exc).__name__}: {exc}"))
    finally:
        engine.dispose()


def test_two_processes_claiming_items_of_one_photo_never_both_hold_its_exclusive_lock(
    db_url: str, engine: Engine, tmp_path: Path
) -> None:
    ctx = mp.get_context("fork")
    photo = store_jobs.PhotoInput(str(tmp_path / "shared.jpg"), 1)
    winners = []
    for _round in range(8):
        # Given two jobs' exif items on one photo, both queued
        items = []
        for _ in range(2):
            job = store_jobs.submit(engine, [EXIF], [photo]).job_id
            items += _item_ids(engine, job, "exif")
        take_for_dispatch(engine, EXIF)
        # When two worker processes claim them at the same instant
        barrier, out = ctx.Barrier(2), ctx.Queue()
        procs = [
            ctx.Process(target=_claim_exif_in_child, args=(db_url, item_id, barrier, out, f"w{k}"))
            for k, item_id in enumerate(items)
        ]
        for p in procs:
            p.start()
        results = [out.get(timeout=120) for _ in procs]
        for p in procs:
            p.join(60)
        # Then at most one holds the photo (the other was deferred holding nothing), never both
        held = [r for r in results if r[2]]
        assert len(held) <= 1, results
        assert all(r[2] or "locked by item" in r[3] for r in results), results
        with Session(engine) as s:
            holders = (
                s.execute(select(Item.id).where(Item.id.in_(items), Item.state == "running")).scalars().all()
            )
        assert len(holders) == len(held)
        winners += held
        # (the holder ends, so the next round's items can take the photo)
        with Session(engine) as s, s.begin():
            s.execute(update(Item).where(Item.id.in_(items)).values(state="cancelled"))
            s.execute(PhotoLock.__table__.delete())
    assert winners, "no round had a winner: the race did not run"


def test_a_claim_that_waited_for_its_item_row_sees_a_rename_committed_meanwhile(
    pg_url: str, tmp_path: Path
) -> None:
    # Given an exif item whose row another transaction holds locked (as a sweeper or cancel may)
    engine = make_engine(pg_url)
    try:
        job = store_jobs.submit(engine, [EXIF], [store_jobs.PhotoInput(str(tmp_path / "old.jpg"), 1)]).job_id
        take_for_dispatch(engine, EXIF)
        [item_id] = _item_ids(engine, job, "exif")
        holder = Session(engine)
        holder.begin()
        holder.execute(select(Item.id).where(Item.id == item_id).with_for_update()).all()
        outcome: list[Any] = []
        claimer = threading.Thread(
            target=lambda: outcome.append(store_items.claim(engine, EXIF, item_id, 0, "w"))
        )

        # When the claim starts, waits for that row, and meanwhile another job's rename of the photo
        # commits with the row still held
        claimer.start()

        waiting = text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND datname = current_database()"  # this test's own database, not another test's
            " AND position('UPDATE items SET state' in query) > 0"
        )

        def claim_waits() -> bool:
            with engine.connect() as c:
                return bool(c.execute(waiting).scalar())

        wait_for(claim_waits, 30, what="the claim to wait for the item's row")
        with Session(engine) as s, s.begin():
            s.execute(update(Photo).values(path=str(tmp_path / "renamed.jpg")))
        holder.commit()
        holder.close()
        claimer.join(30)

        # Then the lease names the photo's current path, not the one before the wait
        [result] = outcome
        assert result.lease is not None, result.reason
        assert result.lease.photo_path == str(tmp_path / "renamed.jpg")
    finally:
        engine.dispose()
