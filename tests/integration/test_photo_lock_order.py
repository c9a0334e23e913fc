"""Photo rows are locked in ascending id on the claim paths that lock several photos (a bundle's
claim, a batch message's claim): a claim that has to wait for a photo holds no photo of a higher
id meanwhile, so two claims over the same photos can never wait for each other (PostgreSQL, where
the rows are locked; SQLite serializes every claim with its write lock)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from store import items as store_items
from store import jobs as store_jobs
from store.claims import claim_batch, lane_lock_request
from store.dispatch import take_for_dispatch
from store.engine import make_engine
from store.lanes import EXCLUSIVE, lane_spec
from store.models import Photo
from tests.support import photo_inputs, wait_for, waiting_for_a_lock

LOCKING = replace(lane_spec("noop", env={}), lock=EXCLUSIVE)
PHOTOS = 5


def _bundle_claim(engine: Engine, tmp_path: Path) -> Callable[[], bool]:
    store_jobs.submit(engine, [LOCKING], photo_inputs(tmp_path, PHOTOS), bundle_lanes=["noop"])
    [pub] = take_for_dispatch(engine, LOCKING)
    return lambda: store_items.claim(engine, LOCKING, pub.item_id, pub.token, "w").lease is not None


def _batch_claim(engine: Engine, tmp_path: Path) -> Callable[[], bool]:
    store_jobs.submit(engine, [LOCKING], photo_inputs(tmp_path, PHOTOS))
    pubs = take_for_dispatch(engine, LOCKING)
    assert len(pubs) == PHOTOS
    pairs = sorted((p.item_id, p.token) for p in pubs)
    requests = {i: lane_lock_request(LOCKING) for i, _ in pairs}

    def run() -> bool:
        return all(o.lease is not None for o in claim_batch(engine, LOCKING, pairs, "w", requests))

    return run


def _free(engine: Engine, photo: int) -> bool:
    """Whether another transaction can lock the photo's row at once."""
    with engine.connect() as probe, probe.begin():
        try:
            probe.execute(text("SELECT id FROM photos WHERE id = :i FOR UPDATE NOWAIT"), {"i": photo})
        except OperationalError as exc:
            if isinstance(exc.orig, psycopg.errors.LockNotAvailable):
                return False
            raise
    return True


@pytest.mark.parametrize("path", [_bundle_claim, _batch_claim], ids=["bundle", "batch"])
def test_a_claim_waiting_for_a_photo_holds_no_photo_above_it(
    pg_url: str, tmp_path: Path, path: Callable[[Engine, Path], Callable[[], bool]]
) -> None:
    engine = make_engine(pg_url)
    holder = engine.connect()
    try:
        # Given a claim of five photos, and another transaction holding the lowest photo's row
        claim = path(engine, tmp_path)
        with Session(engine) as s:
            ids = sorted(s.execute(select(Photo.id)).scalars())
        tx = holder.begin()
        holder.execute(text("SELECT id FROM photos WHERE id = :i FOR UPDATE"), {"i": ids[0]})
        result: list[bool] = []
        claimer = threading.Thread(target=lambda: result.append(claim()))
        # When the claim runs and waits for that photo
        claimer.start()
        wait_for(lambda: waiting_for_a_lock(engine) >= 1, 30, what="the claim to wait for the lowest photo")
        # Then it holds none of the photos above it: each can be taken at once (NOWAIT) by another
        held = [photo for photo in ids[1:] if not _free(engine, photo)]
        assert held == [], f"photos {held} were locked by the claim while it waited for photo {ids[0]}"
        # And once the holder lets go the claim takes every photo
        tx.rollback()
        claimer.join(60)
        assert result == [True]
    finally:
        holder.close()
        engine.dispose()
