"""An exif attempt killed between exiftool's write and the rename to its staged name leaves exiftool's
output file behind; the item's next attempt removes it (``photos.exif._exiftool_out_name`` carries
the attempt's tag, ``actors.effects.FileEffects.sweep_temps`` removes an earlier attempt's files).
Real store (SQLite and PostgreSQL), real exiftool, the lane's own code run in this process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from middleware import failpoints
from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exif import read_metadata
from store.intents import settle_orphans
from store.lanes import lane_spec
from store.sweeper import revoke_expired
from tests.inline_lanes import run_item
from tests.raw_support import make_xmp_sidecar
from tests.support import expire_running_leases, items_of


class WorkerKilled(BaseException):
    """The worker process died here (nothing after this line of the attempt ran)."""


def test_the_next_attempt_removes_what_a_killed_exiftool_write_left(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an exif job on one photo whose first attempt dies right after exiftool wrote its output,
    # before that output was renamed to the attempt's staged name
    folder = tmp_path / "photos"
    (photo,) = generate_samples(folder, 1, seed=5, size=(64, 48))
    client = Client(Settings.from_env({}), engine=engine)
    job = client.submit(["exif"], [folder], {"exif.keywords": "kept"}).job_id
    real_replace = os.replace

    def dies_at_the_rename(src: Any, dst: Any, **kw: Any) -> None:
        if kw.get("src_dir_fd") is not None:
            raise WorkerKilled
        real_replace(src, dst, **kw)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", dies_at_the_rename)
        with pytest.raises(WorkerKilled):
            run_item(engine, items_of(engine, job)[0])
    (left,) = [p for p in folder.iterdir() if p.name.endswith(".tmp")]
    assert left.name.startswith(".exiftool-") and left.name.endswith(".tmp"), left.name
    # When its lease runs out, the sweeper revokes it and the item's next attempt runs
    expire_running_leases(engine)
    assert revoke_expired(engine, {"exif": lane_spec("exif", env={})})[0] == 1
    run_item(engine, items_of(engine, job)[0])
    # Then the photo is edited once and nothing of the killed attempt is left in its folder
    assert sorted(p.name for p in folder.iterdir() if p.name != ".photojobs-history") == [photo.name]
    assert read_metadata(photo)["keywords"] == ["kept"]
    client.engine.dispose()


def test_a_paused_photo_and_sidecar_edit_killed_after_its_first_write_lands_whole(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a JPEG with a Lightroom sidecar and an exif keywords job whose attempt dies right after
    # the first of its two writes (found by the photo chaos run: a worker stopped at
    # exif.after_apply, its job paused meanwhile)
    folder = tmp_path / "photos"
    (photo,) = generate_samples(folder, 1, seed=7, size=(64, 48))
    sidecar = make_xmp_sidecar(photo.with_suffix(".xmp"), keywords=("mine",), rating=2)
    client = Client(Settings.from_env({}), engine=engine)
    job = client.submit(["exif"], [folder], {"exif.keywords": "chaos,wave2"}).job_id

    def dies_after_the_first_apply(name: str) -> None:
        if name == "exif.after_apply":
            raise WorkerKilled

    with monkeypatch.context() as m:
        m.setattr(failpoints, "hit", dies_after_the_first_apply)
        with pytest.raises(WorkerKilled):
            run_item(engine, items_of(engine, job)[0])
    # When the job is paused, the lease runs out, the sweeper revokes it and settles the stopped
    # item's intents, and the job is resumed and its item's next attempt runs
    client.pause(job)
    expire_running_leases(engine)
    assert revoke_expired(engine, {"exif": lane_spec("exif", env={})})[0] == 1
    assert items_of(engine, job)[0].state == "paused"
    settle_orphans(engine)
    client.resume(job)
    run_item(engine, items_of(engine, job)[0])
    # Then the photo and its sidecar both hold the keywords, once: the unit landed whole
    assert items_of(engine, job)[0].state == "succeeded"
    assert read_metadata(photo)["keywords"] == ["chaos", "wave2"]
    xmp = sidecar.read_text()
    assert [xmp.count(f"<rdf:li>{k}</rdf:li>") for k in ("mine", "chaos", "wave2")] == [1, 1, 1], xmp
    client.engine.dispose()
