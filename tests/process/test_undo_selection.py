"""Undo previewed, undo of one photo and restore on purpose (issue 39), through the command and real
workers on both stores: ``photojobs undo J --dry-run --json`` changes nothing, ``undo J --photo P``
puts back that photo only, ``restore P --before J`` brings back the version before the job over an
edit by hand (and its undo puts the edit back)."""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exiftool import ExifTool
from photos.fileops import sha256_file
from store.models import Job
from tests.support import Fleet, photojobs

from .test_undo import PARAMS, cli_json, tree, wait_job


def jobs(engine: Engine) -> int:
    with Session(engine) as s:
        return int(s.execute(select(func.count()).select_from(Job)).scalar_one())


def test_dry_run_then_one_photo_undone_then_an_edit_by_hand_restored_through_workers(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given four photos shifted and renamed by one job, run by a worker, and one edited by hand since
    folder = tmp_path / "photos"
    generate_samples(folder, 4, seed=3939, size=(128, 96))
    originals = tree(folder)
    fleet.start_sweeper()
    fleet.start_worker(["exif", "rename"], threads=2)
    client = Client(Settings.from_env(env))
    job = client.submit(["exif", "rename"], [folder], PARAMS).job_id
    assert wait_job(engine, job) == "succeeded"
    after_job = tree(folder)
    edited, chosen = folder / sorted(after_job)[0], folder / sorted(after_job)[2]
    ExifTool.shared().execute("-Rating=2", "-overwrite_original", os.path.abspath(edited))
    by_hand = tree(folder)
    submitted = jobs(engine)

    # When the undo is dry run from the command
    plan = cli_json(env, "undo", str(job), "--dry-run")
    # Then it plans three restores and refuses the edited photo saying what changed; nothing moves
    actions = {Path(p["path"]).name: p["action"] for p in plan["plan"]}
    assert plan["dry_run"] is True and actions.pop(edited.name) == "refuse"
    assert set(actions.values()) == {"restore"} and len(actions) == 3
    assert tree(folder) == by_hand and jobs(engine) == submitted

    # When only one photo is undone, by its current path
    one = cli_json(env, "undo", str(job), "--photo", str(chosen))
    assert one["items"] == 2 and wait_job(engine, one["job"]) == "succeeded"
    # Then that photo is back at its old name with its original bytes, the others as they were
    now = tree(folder)
    back = set(now) - set(by_hand)
    assert chosen.name not in now and len(back) == 1
    (name,) = back
    assert now[name] == originals[name]
    assert {k: v for k, v in now.items() if k != name} == {
        k: v for k, v in by_hand.items() if k != chosen.name
    }

    # When the photo edited by hand is restored, on purpose, to its version before the job
    restore = cli_json(env, "restore", str(edited), "--before", str(job))
    fleet.start_worker(["exif"], threads=1)  # any worker of the lane will do
    assert wait_job(engine, restore["job"]) == "succeeded"
    # Then it holds the bytes it had before the job (at its current name), and the history says so
    before_job = {v for k, v in originals.items() if k not in after_job}
    assert sha256_file(edited) == restore["sha256"] and restore["sha256"] in before_job
    shown = photojobs(env, "history", str(edited))
    assert shown.returncode == 0 and "restored" in shown.stdout, shown.stdout
    # and the undo of the restore puts the edit by hand back, byte for byte
    undo = cli_json(env, "undo", str(restore["job"]))
    assert wait_job(engine, undo["job"]) == "succeeded"
    assert sha256_file(edited) == by_hand[edited.name]
    shown = photojobs(env, "history", str(edited))
    assert f"undo of job {restore['job']}" in shown.stdout, shown.stdout
    client.engine.dispose()
