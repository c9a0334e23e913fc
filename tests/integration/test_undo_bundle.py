"""An archive bundle is not undone, and says so (issue 31): the bundle is a copy (the originals never
moved), a backup an undo never deletes. SQLite and PostgreSQL; the archive lane's own code run item by
item in the test's process (``tests.inline_lanes``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.errors import PhotoError
from store.history import BUNDLE_STAYS, UNDO_JOB
from store.lanes import lane_spec
from store.models import Item
from store.submission import PhotoInput, submit
from tests.inline_lanes import run_item


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        items = list(s.execute(select(Item).where(Item.job_id == job).order_by(Item.id)).scalars())
        for item in items:
            s.expunge(item)
    return items


def test_an_archive_bundle_is_left_in_place_by_an_undo_which_says_why(engine: Engine, tmp_path: Path) -> None:
    # Given two photos bundled into a zip by an archive job
    folder = tmp_path / "photos"
    generate_samples(folder, 2, seed=5, size=(64, 48))
    root = tmp_path / "archive"
    client = Client(Settings.from_env({}), engine=engine)
    job = client.submit(["archive"], [folder], {"archive.bundle": "zip", "archive.root": str(root)}).job_id
    (bundle_item,) = _items(engine, job)
    bundle = Path(run_item(engine, bundle_item)["bundle"])
    assert bundle.is_file()
    # When the job is undone (all lanes, or its archive lane)
    for lane in (None, "archive"):
        out = client.undo(job, lane=lane)
        # Then no undo job is made, the note names the bundle and why it stays, and it is there
        assert out["job"] is None, out
        assert str(bundle) in out["note"] and BUNDLE_STAYS in out["note"]
        assert "undone already" not in out["note"]
    assert bundle.is_file() and len(list(folder.iterdir())) == 2
    # and an undo job's bundle item, however it came to be, is refused with that reason (not skipped)
    made = submit(engine, [lane_spec("archive")], [PhotoInput(str(p)) for p in sorted(folder.iterdir())],
                  params={UNDO_JOB: job, "archive.bundle": "zip", "archive.root": str(root)},
                  bundle_lanes=["archive"])  # fmt: skip
    with pytest.raises(PhotoError, match="an archive bundle is a copy and is not undone"):
        run_item(engine, _items(engine, made.job_id)[0])
    assert bundle.is_file()
    client.engine.dispose()
