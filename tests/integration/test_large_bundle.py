"""A bundle of more photos than a statement may have bind parameters (PostgreSQL 65,535, SQLite
32,766) is claimed, locked and finished: the lock statements and IN lists go in chunks."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.fencing import fenced
from store.lanes import EXCLUSIVE, lane_spec
from store.models import PhotoLock
from store.photo_locks import IN_CHUNK
from tests.integration.test_statement_budget import counting, job_end

PHOTOS = 70_000
LOCKING = replace(lane_spec("noop", env={}), lock=EXCLUSIVE)
CHUNKS = -(-PHOTOS // IN_CHUNK)  # IN lists of at most IN_CHUNK values: 7
# The budget (statements, counted as in test_statement_budget.py; not wall time): a size regression
# (a statement per photo, or per photo lock) is 70,000 statements, and fails loudly. The claim: its
# compare-and-set, the bundle's photos read, per chunk the photo rows locked (PostgreSQL), the lock
# conflicts read and the lock rows inserted (one executemany), the lease restarted, the event.
CLAIM_BUDGET = {"sqlite": 4 + 2 * CHUNKS, "postgresql": 4 + 3 * CHUNKS}
# The succeed: the fenced UPDATE, the lock rows dropped (one DELETE, whatever the size), the event.
SUCCEED_BUDGET = 3


def _shown(statements: list[str]) -> str:
    return f"{len(statements)} statements:\n" + "\n".join(" ".join(s.split())[:160] for s in statements)


def test_bundle_of_70000_photos_is_claimed_and_finished(engine: Engine, tmp_path: Path) -> None:
    # Given one bundle item naming 70,000 photos in a lane that locks them exclusively
    inputs = [store_jobs.PhotoInput(str(tmp_path / f"p{i:06d}.jpg"), 1) for i in range(PHOTOS)]
    job = store_jobs.submit(engine, [LOCKING], inputs, bundle_lanes=["noop"]).job_id
    [pub] = take_for_dispatch(engine, LOCKING)
    # When it is claimed
    with counting(engine) as claimed:
        outcome = store_items.claim(engine, LOCKING, pub.item_id, pub.token, "w")
    # Then the claim holds a lock on every photo, in statements that grow with the chunks, not the photos
    assert outcome.lease is not None, outcome.reason
    assert len(claimed.statements) <= CLAIM_BUDGET[engine.dialect.name], _shown(claimed.statements)
    assert len(outcome.lease.photo_ids) == PHOTOS
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(PhotoLock)).scalar_one() == PHOTOS
    # When it succeeds
    with counting(engine) as finished:
        with fenced(engine, outcome.lease.item_id, outcome.lease.token, worker="w") as s:
            store_items.succeed(s, outcome.lease, {"ok": True}, "w")
    # Then the job succeeded and the locks are gone, in a few statements (and the job's end: issue 38)
    assert len(finished.statements) <= SUCCEED_BUDGET + job_end(engine), _shown(finished.statements)
    assert store_jobs.job_status(engine, job).state == "succeeded"
    with Session(engine) as s:
        assert s.execute(select(func.count()).select_from(PhotoLock)).scalar_one() == 0
