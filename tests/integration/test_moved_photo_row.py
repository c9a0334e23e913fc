"""The sweeper moves a photo row to where a landed, then edited, move left the photo (issue 22),
and a row that cannot follow (another photo row already names the path) does not fail its pass."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photos import fileops
from photos.recovery import link_staged
from photos.rootfs import Roots
from store import intents as store_intents
from store import items as store_items
from store import jobs as store_jobs
from store.fencing import fenced
from store.lanes import lane_spec
from store.models import Event, Intent, Item, Photo, PhotoLock
from store.sweeper import revoke_expired
from tests.support import wait_for

RENAME = replace(lane_spec("rename", env={}), lease_ttl=0.05)


def _submit(engine: Engine, photo: Path) -> int:
    return store_jobs.submit(
        engine, [RENAME], [store_jobs.PhotoInput(str(photo), 5)], roots=[str(photo.parent)]
    ).job_id


def _item(engine: Engine, job: int) -> Item:
    with Session(engine) as s:
        return s.execute(select(Item).where(Item.job_id == job)).scalar_one()


def _landed_move_then_edited(engine: Engine, tmp_path: Path) -> tuple[store_items.Lease, Path, Path, int]:
    """A rename attempt that recorded its move, landed it and died; then the photo was edited."""
    photo, target = tmp_path / "a.jpg", tmp_path / "b.jpg"
    photo.write_bytes(b"PHOTO")
    job = _submit(engine, photo)
    lease = store_items.claim(engine, RENAME, _item(engine, job).id, 0, "doomed").lease
    assert lease is not None
    staged = link_staged(photo, f"i{lease.item_id}-t{lease.token}", within=Roots([tmp_path]))
    assert staged is not None
    sha = fileops.sha256_file(photo)
    with fenced(engine, lease.item_id, lease.token) as s:
        intent = store_intents.record(
            s, lease, kind="move", staged=str(staged), target=str(target), source=str(photo),
            sha256=sha, base_sha256=sha, worker="doomed",
        )  # fmt: skip
    os.rename(staged, target)  # the move lands, the old name goes, the worker dies
    photo.unlink()
    edited = tmp_path / "b.jpg.new"
    edited.write_bytes(b"EDITED")
    os.replace(edited, target)  # another program edits the moved photo
    return lease, photo, target, intent


def _cancel_and_revoke(engine: Engine, lease: store_items.Lease) -> None:
    store_jobs.cancel(engine, lease.job_id)
    wait_for(lambda: revoke_expired(engine, {"rename": RENAME})[0], 10, what="the revocation")
    assert _item(engine, lease.job_id).state == "cancelled"


@pytest.mark.parametrize("second_row", [False, True], ids=["row-follows", "path-named-by-another-row"])
def test_sweeper_settles_a_landed_then_edited_move(engine: Engine, tmp_path: Path, second_row: bool) -> None:
    # Given a cancelled rename whose move landed before its worker died, the photo then edited at
    # its new name (and, in one case, the new name submitted meanwhile: a second photo row for it)
    lease, photo, target, intent = _landed_move_then_edited(engine, tmp_path)
    _cancel_and_revoke(engine, lease)
    if second_row:
        _submit(engine, target)
    # When the sweeper settles the orphaned intent
    assert store_intents.settle_orphans(engine) == 1
    # Then the intent is applied (the move did land), nothing is locked and the disk is untouched
    with Session(engine) as s:
        assert s.get(Intent, intent).state == "applied"  # type: ignore[union-attr]
        row = s.get(Photo, lease.photo_id)
        assert row is not None
        (note,) = [
            e.detail["note"]
            for e in s.execute(select(Event).where(Event.type == "intent_applied")).scalars()
        ]
        assert s.execute(select(PhotoLock)).all() == []
    assert target.read_bytes() == b"EDITED" and not photo.exists()
    assert "changed by someone else" in note and str(target) in note
    if second_row:
        # And the row another row's path blocks stays where it was, saying why, the pass not failed
        assert (row.path, row.sha256) == (str(photo), None)
        assert f"another photo row already names {target}" in note
    else:
        # And the photo's row follows the file: its new path and the content found there
        assert (row.path, row.sha256) == (str(target), fileops.sha256_file(target))
