"""Runtime bugs the chaos work found, each reproduced deterministically and judged by the checker.

Every test states the behaviour the runtime should have and is marked ``xfail(strict=True)`` while
the bug stands: when a fix lands the test passes, strict xfail turns that into a failure, and the
marker must go (the test then guards the fix).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select, text, update
from sqlalchemy.orm import Session

from middleware.context import ItemContext, Stopped
from middleware.lease import LeaseMiddleware
from photojobs.lanes import all_lanes, lane_spec
from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.engine import make_engine
from store.errors import StaleLease
from store.events import emit
from store.fencing import fenced
from store.models import CANCEL, CANCELLED, PAUSE, PAUSED, PENDING, QUEUED, WAITING, Item
from store.sweeper import revoke_expired
from tests.chaos.checker import check
from tests.support import wait_for

NOOP = lane_spec("noop", env={})
ANALYSIS = lane_spec("analysis", env={})
EXIF = lane_spec("exif", env={})


def _submit(engine: Engine, tmp_path: Path, names: list[str], specs=(NOOP,)) -> int:  # type: ignore[no-untyped-def]
    photos = [store_jobs.PhotoInput(str(tmp_path / n), 1) for n in names]
    return store_jobs.submit(engine, list(specs), photos).job_id


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        return list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())


def _expire(engine: Engine, item_id: int) -> None:
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.id == item_id).values(lease_expires_at=0.0))


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


def _someone_waits_for_a_lock(engine: Engine) -> bool:
    with engine.connect() as conn:
        return bool(
            conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def _open_control(engine: Engine, job: int, control: str, from_states: tuple[str, ...], to: str) -> Session:
    """A job's cancel/pause transaction (store.jobs.cancel/pause) stopped just before its commit."""
    s, row = store_jobs._control(engine, job)
    row.control = control
    s.flush()
    why = "job cancelled" if control == CANCEL else "job paused"
    n = store_jobs._set_items(s, job, from_states, to, f"item_{to}", why)
    request = "job_cancel_requested" if control == CANCEL else "job_pause_requested"
    emit(s, request, job_id=job, detail={"cancelled_now" if control == CANCEL else "paused_now": n})
    return s


# -- 1. store/sweeper.py revoke_expired: the lease_expired event names the wrong lease ------------------


@pytest.mark.xfail(
    strict=True,
    reason="BUG 1: store/sweeper.py revoke_expired emits lease_expired (and the quarantine item_failed) "
    "from the ORM object its UPDATE already synchronized: token = new + 1, old_token = the new token, "
    "worker = None",
)
def test_lease_expired_event_names_the_revoked_lease(engine: Engine, tmp_path: Path) -> None:
    # Given an item claimed by worker w1 with token 1
    job = _submit(engine, tmp_path, ["a.jpg"])
    take_for_dispatch(engine, NOOP, bound=4)
    [item] = _items(engine, job)
    lease = store_items.claim(engine, NOOP, item.id, 0, "w1").lease
    assert lease is not None and lease.token == 1
    # When its lease expires and the sweeper revokes it, and the zombie's late commit is refused
    _expire(engine, item.id)
    assert revoke_expired(engine, {"noop": NOOP}) == (1, 0)
    with pytest.raises(StaleLease):
        with fenced(engine, item.id, lease.token, worker="w1", what="succeed") as s:
            store_items.succeed(s, lease, None, "w1")
    # Then the store holds token 2, and the event says so: token 2, old_token 1, worker w1
    assert _items(engine, job)[0].fencing_token == 2
    assert check(engine, job_ids=[job], require_settled=False) == []


# -- 2. middleware/lease.py finish: a pause stop reads the job control outside its transaction --------


class _RacingControl:
    """store.items.job_control, with a user's resume or cancel landing just after the read."""

    def __init__(self, engine: Engine, then: str) -> None:
        self.engine, self.then = engine, then
        self.real = store_items.job_control

    def __call__(self, engine: Engine, job_id: int) -> str | None:
        control = self.real(engine, job_id)
        getattr(store_jobs, self.then)(self.engine, job_id)
        return control


@pytest.mark.xfail(
    strict=True,
    reason="BUG 2: middleware/lease.py finish() reads the job control (store.items.job_control) in its "
    "own transaction and store.items.stop() trusts it; a resume or cancel committed in between leaves the "
    "item paused under a running or cancelled job: nothing resumes it, the job never finishes",
)
@pytest.mark.parametrize("then", ["resume", "cancel"])
def test_pause_stop_racing_a_resume_or_cancel_does_not_strand_the_item(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, then: str
) -> None:
    # Given a running item of a job the user pauses (the heartbeat passes the pause on)
    job = _submit(engine, tmp_path, ["a.jpg", "b.jpg"])
    take_for_dispatch(engine, NOOP, bound=4)
    first = _items(engine, job)[0]
    lease = store_items.claim(engine, NOOP, first.id, 0, "w1").lease
    assert lease is not None
    store_jobs.pause(engine, job)
    middleware = LeaseMiddleware(all_lanes({}), lambda: engine, heartbeat_interval=60)
    middleware.worker = "w1"
    ctx = ItemContext(lease=lease, spec=NOOP, engine=engine, worker="w1")
    # When the actor stops at its safe point, and the user's resume (or cancel) commits between the
    # middleware reading the job's control and committing the stop
    monkeypatch.setattr(store_items, "job_control", _RacingControl(engine, then))
    middleware.finish(ctx, None, Stopped("pause", "job paused"))
    # Then the item is not left paused: pending again after a resume, cancelled after a cancel
    assert check(engine, job_ids=[job], require_settled=False) == []
    state = _items(engine, job)[0].state
    assert state == (PENDING if then == "resume" else CANCELLED), f"item is {state}"


# -- 3. store/dispatch.py take_for_dispatch: item_queued for items it did not queue (PostgreSQL) ------


@pytest.mark.xfail(
    strict=True,
    reason="BUG 3: store/dispatch.py take_for_dispatch emits item_queued and returns a Publish for every "
    "picked row, though its guarded UPDATE skipped the rows a concurrent pause/cancel changed meanwhile",
)
@pytest.mark.parametrize("control", [PAUSE, CANCEL])
def test_dispatch_racing_a_pause_or_cancel_logs_only_what_it_queued(
    pg_engine: Engine, tmp_path: Path, control: str
) -> None:
    # Given a pending item, and the user's pause (or cancel) of its job in flight (row locks taken)
    job = _submit(pg_engine, tmp_path, ["a.jpg"])
    to = PAUSED if control == PAUSE else CANCELLED
    pending = _open_control(pg_engine, job, control, (PENDING, QUEUED), to)
    got: dict[str, Any] = {}
    dispatcher = threading.Thread(
        target=lambda: got.update(publish=take_for_dispatch(pg_engine, NOOP, bound=4))
    )
    # When the dispatcher picks the item (it still reads pending) and the pause commits before its UPDATE
    dispatcher.start()
    wait_for(lambda: _someone_waits_for_a_lock(pg_engine), 10, what="the dispatcher to wait for the row lock")
    pending.commit()
    pending.close()
    dispatcher.join(10)
    # Then nothing is published or logged for the item it did not queue
    assert check(pg_engine, job_ids=[job], require_settled=False) == []
    assert _items(pg_engine, job)[0].state == to
    assert got["publish"] == []


# -- 4. store/items.py advance_pipeline / skip_successors: unguarded UPDATEs (PostgreSQL) -------------


@pytest.mark.xfail(
    strict=True,
    reason="BUG 4: store/items.py advance_pipeline and skip_successors select the WAITING successors, then "
    "UPDATE them by id without a state guard: a cancel committed in between is overwritten (cancelled -> "
    "skipped) or logged twice (a second item_cancelled)",
)
@pytest.mark.parametrize("outcome", ["succeed", "fail"])
def test_next_lane_racing_a_cancel_keeps_one_cancellation(
    pg_engine: Engine, tmp_path: Path, outcome: str
) -> None:
    # Given a two-lane job (analysis then exif) whose analysis item is running
    job = _submit(pg_engine, tmp_path, ["a.jpg"], specs=(ANALYSIS, EXIF))
    first, second = _items(pg_engine, job)
    assert (first.state, second.state) == (PENDING, WAITING)
    lease = store_items.claim(pg_engine, ANALYSIS, first.id, 0, "w1").lease
    assert lease is not None
    # And the user's cancel in flight: the waiting exif item is cancelled, not yet committed
    cancelling = _open_control(pg_engine, job, CANCEL, (WAITING, PENDING, QUEUED, PAUSED), CANCELLED)

    def finish() -> None:
        with fenced(pg_engine, first.id, lease.token, worker="w1") as s:
            if outcome == "succeed":
                store_items.succeed(s, lease, None, "w1")
            else:
                store_items.fail(s, ANALYSIS, lease, "unreadable photo", "w1", retry=False)

    worker = threading.Thread(target=finish)
    # When the analysis item finishes (it reads the exif item as waiting) and the cancel commits
    worker.start()
    wait_for(lambda: _someone_waits_for_a_lock(pg_engine), 10, what="the worker to wait for the cancel")
    cancelling.commit()
    cancelling.close()
    worker.join(10)
    # Then the exif item stays cancelled, with one item_cancelled event
    assert check(pg_engine, job_ids=[job]) == []
    assert _items(pg_engine, job)[1].state == CANCELLED


# -- 5. pauses count as attempts: one crash after two pauses quarantines an item -----------------------


@pytest.mark.xfail(
    strict=True,
    reason="BUG 5: store/items.py stop() keeps the attempt of a paused (or cancelled) run, so pauses use up "
    "max_attempts: after two pauses one lease expiry quarantines the item as 'killed its worker 3 times' "
    "(and one transient error fails it without retry)",
)
def test_pauses_do_not_use_up_attempts(engine: Engine, tmp_path: Path) -> None:
    # Given an item paused mid-run twice (the job paused and resumed twice), max_attempts = 3
    job = _submit(engine, tmp_path, ["a.jpg"])
    [item] = _items(engine, job)
    token = 0
    for _ in range(2):
        take_for_dispatch(engine, NOOP, bound=4)
        lease = store_items.claim(engine, NOOP, item.id, token, "w1").lease
        assert lease is not None
        store_jobs.pause(engine, job)
        with fenced(engine, item.id, lease.token, worker="w1", what="stop") as s:
            store_items.stop(s, lease, store_items.job_control(engine, job), "w1", "paused")
        store_jobs.resume(engine, job)
        token = lease.token
    take_for_dispatch(engine, NOOP, bound=4)
    lease = store_items.claim(engine, NOOP, item.id, token, "w1").lease
    assert lease is not None
    # When its worker is killed once (the lease expires and is revoked)
    _expire(engine, item.id)
    revoked, quarantined = revoke_expired(engine, {"noop": NOOP})
    # Then the item is retried, not quarantined as a worker killer
    [after] = _items(engine, job)
    assert (revoked, quarantined) == (1, 0), f"item is {after.state}: {after.error}"
    assert after.state == PENDING
