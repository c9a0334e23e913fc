"""Undo, round two (issue 39), through real workers on both stores: a job over bursts whose names were
freed and taken again, undone by a fleet with no retry (the deferral of an undo item through the
worker's finish)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from store.status import job_status
from tests.burst_support import PARAMS, bursts, run_photo_by_photo, tree
from tests.support import Fleet, events_of, item_states, items_of, job_done, wait_for

LANES = ["exif", "rename", "archive"]


def wait_job(engine: Engine, job: int) -> str:
    wait_for(lambda: job_done(engine, job), 240, what=f"job {job} to finish: {item_states(engine, job)}")
    return job_status(engine, job).state


def test_a_burst_job_through_exif_rename_archive_is_undone_by_workers_with_no_retry(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given twelve shots in four bursts, shifted, renamed and archived by one job, photo after photo
    # (so each burst's shots took the one name their predecessor's archive had just freed)
    folder = tmp_path / "card"
    bursts(folder, 12)
    originals = tree(folder)
    client = Client(Settings.from_env(env))
    job = client.submit(LANES, [folder], PARAMS).job_id
    renamed = run_photo_by_photo(engine, job, [f"IMG_{n}.jpg" for n in range(12)], LANES)
    assert len(set(renamed)) == 4, renamed
    # When the job is undone by two workers of two threads each
    fleet.start_sweeper()
    for _ in range(2):
        fleet.start_worker(LANES, threads=2)
    undo = client.undo(job)
    assert undo["items"] == 36
    # Then the undo succeeds whole, with no failure and no retry, every shot back byte for byte
    ended = wait_job(engine, undo["job"])
    left = [(i.id, i.lane, i.state, i.error) for i in items_of(engine, undo["job"]) if i.state != "succeeded"]
    assert ended == "succeeded", left
    assert tree(folder) == originals
    undo_items = {i.id for i in items_of(engine, undo["job"])}
    retried = [e for e in events_of(engine, "item_retry_scheduled") if e.item_id in undo_items]
    failed = [e for e in events_of(engine, "item_failed") if e.item_id in undo_items]
    assert retried == [] and failed == []
    assert {i.attempt for i in items_of(engine, undo["job"])} == {1}
    client.engine.dispose()
