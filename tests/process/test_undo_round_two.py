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


# On PostgreSQL two workers racing for one freed name made this test fail in 2 of 3 CI runs and in
# ~1 of 4 runs beside each other (2026-12-07): a look at the photos' rows and at the recorded
# intents in two statements with a settle committing between them (store.history.leaving_occupant:
# the intents first now), a record refused by a row that left right after (actors.undo
# ._wait_for_leaving: a name freed meanwhile is tried again), a move whose record ran before the
# other photo's move committed (the FileExistsError: it waits for that photo too). After the fixes:
# 14 of 14 such runs passed.
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
    assert ended == "succeeded", (left, _effects_of_photos(engine, undo["job"]))
    assert tree(folder) == originals
    undo_items = {i.id for i in items_of(engine, undo["job"])}
    retried = [e for e in events_of(engine, "item_retry_scheduled") if e.item_id in undo_items]
    failed = [e for e in events_of(engine, "item_failed") if e.item_id in undo_items]
    assert retried == [] and failed == []
    assert {i.attempt for i in items_of(engine, undo["job"])} == {1}
    client.engine.dispose()


def _effects_of_photos(engine: Engine, undo_job: int) -> list[tuple[object, ...]]:
    """Every effect on the photos of the undo's items that did not succeed (the known bug's trail)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    from store.models import Item, PhotoEffect

    with Session(engine) as s:
        photos = set(
            s.execute(
                select(Item.photo_id).where(Item.job_id == undo_job, Item.state != "succeeded")
            ).scalars()
        )
        rows = s.execute(
            select(PhotoEffect).where(PhotoEffect.photo_id.in_(photos)).order_by(PhotoEffect.id)
        ).scalars()
        return [
            (e.id, e.photo_id, e.job_id, e.item_id, e.lane, e.effect, e.undoes, e.undone_by,
             (e.from_path or "")[-32:], e.to_path[-32:])
            for e in rows
        ]  # fmt: skip
