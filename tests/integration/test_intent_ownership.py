"""Intents own their photo until settled (docs/design.md rules 6 and 9), against the real store."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photos import fileops
from store import intents as store_intents
from store import items as store_items
from store import jobs as store_jobs
from store.lanes import lane_spec
from store.models import Intent, Item, Photo, PhotoLock
from store.sweeper import revoke_expired
from tests.support import record_staged_edit, wait_for

EXIF = replace(lane_spec("exif", env={}), lease_ttl=0.05)
RENAME = lane_spec("rename", env={})


def _job(engine: Engine, spec, photo: Path, roots: list[str]) -> int:  # type: ignore[no-untyped-def]
    return store_jobs.submit(engine, [spec], [store_jobs.PhotoInput(str(photo), 4)], roots=roots).job_id


def _item(engine: Engine, job: int) -> Item:
    with Session(engine) as s:
        return s.execute(select(Item).where(Item.job_id == job)).scalar_one()


def _locks(engine: Engine) -> list[tuple[int, int | None]]:
    with Session(engine) as s:
        return [(lk.item_id, lk.intent_id) for lk in s.execute(select(PhotoLock)).scalars()]


def _record_edit(engine: Engine, photo: Path) -> tuple[store_items.Lease, Path, int]:
    """Claim the exif item and record a staged edit of ``photo``, as an attempt does before it dies."""
    job = _job(engine, EXIF, photo, [str(photo.parent)])
    item = _item(engine, job)
    return record_staged_edit(engine, EXIF, item.id, photo)


def test_revoked_lease_passes_the_photo_lock_to_the_intent(engine: Engine, tmp_path: Path) -> None:
    # Given an exif attempt that recorded an intent and then lost its lease
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"BASE")
    lease, staged, intent = _record_edit(engine, photo)
    wait_for(lambda: revoke_expired(engine, {"exif": EXIF})[0], 10, what="the revocation")
    # Then the photo stays locked, now by the intent
    assert _item(engine, lease.job_id).state == "pending"
    assert _locks(engine) == [(lease.item_id, intent)]
    # When another job's rename of the photo is claimed / Then it is deferred, holding nothing
    other = _item(engine, _job(engine, RENAME, photo, [str(tmp_path)]))
    outcome = store_items.claim(engine, RENAME, other.id, 0, "w2")
    assert outcome.lease is None and outcome.deferred
    assert f"locked by item {lease.item_id}" in outcome.reason
    # And the item's own next attempt takes its locks back to recover the intent
    again = store_items.claim(engine, EXIF, lease.item_id, lease.token + 1, "w3").lease
    assert again is not None
    assert _locks(engine) == [(lease.item_id, None)]


@pytest.mark.parametrize("stop", ["cancel", "pause", "quarantine"])
@pytest.mark.parametrize("applied", [False, True], ids=["not-applied", "applied"])
def test_stopped_items_intents_are_settled_by_the_sweeper(
    engine: Engine, tmp_path: Path, stop: str, applied: bool
) -> None:
    # Given an attempt that recorded an intent (and maybe applied it) and then lost its lease, and
    # whose item then stopped: its job cancelled or paused, or its attempts used up (quarantined)
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"BASE")
    lease, staged, intent = _record_edit(engine, photo)
    if applied:
        os.replace(staged, photo)
    if stop != "quarantine":
        getattr(store_jobs, stop)(engine, lease.job_id)
    spec = replace(EXIF, max_attempts=1) if stop == "quarantine" else EXIF
    wait_for(lambda: revoke_expired(engine, {"exif": spec})[0], 10, what="the revocation")
    expected = {"cancel": "cancelled", "pause": "paused", "quarantine": "failed"}[stop]
    assert _item(engine, lease.job_id).state == expected
    assert _locks(engine) == [(lease.item_id, intent)]
    # When the sweeper settles orphaned intents
    assert store_intents.settle_orphans(engine) == 1
    # Then the intent is settled as the disk says (never applied by the sweeper), nothing staged is
    # left, the lock is free and the store knows the photo's content
    with Session(engine) as s:
        assert s.get(Intent, intent).state == ("applied" if applied else "discarded")  # type: ignore[union-attr]
        stored = s.get(Photo, lease.photo_id).sha256  # type: ignore[union-attr]
    assert not staged.exists() and photo.read_bytes() == (b"EDITED" if applied else b"BASE")
    assert stored == (fileops.sha256_file(photo) if applied else None)
    assert _locks(engine) == []
    assert [p.name for p in tmp_path.iterdir() if fileops.is_staged_name(p.name)] == []


def test_stray_sweep_removes_only_old_unowned_staged_files_inside_roots(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job's root with: an old unowned staged file, a fresh one, a live intent's staged file,
    # an old file that is not ours; and an old staged file outside every root
    root = tmp_path / "root"
    root.mkdir()
    photo = root / "a.jpg"
    photo.write_bytes(b"BASE")
    _lease, live, _intent = _record_edit(engine, photo)
    old = fileops.staged_path(root / "b.jpg", "i9-t9")
    also = fileops.staged_path(root / "sub" / "c.jpg", "i8-t1")
    also.parent.mkdir()
    theirs = root / ".b.jpg.tmp"
    outside = fileops.staged_path(tmp_path / "z.jpg", "i9-t9")
    for f in (old, also, theirs, outside):
        f.write_bytes(b"x")
    # When the stray sweep runs within the grace period / Then nothing is removed (an attempt may
    # still be writing its staged file)
    assert store_intents.sweep_stray_staged(engine, grace=3600.0) == []
    # When it runs past the grace period
    removed = store_intents.sweep_stray_staged(engine, grace=0.0)
    # Then only unowned files of our pattern inside the job's roots went
    assert sorted(removed) == sorted([old, also])
    assert live.exists() and theirs.exists() and outside.exists() and photo.exists()
