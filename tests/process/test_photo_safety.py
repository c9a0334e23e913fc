"""Photo safety across jobs and lost leases (issue 10), with real workers, Redis and image files.

An intent owns its photo until it is settled: a revoked lease does not free the photo for another
job while an edit may still be half-applied; recovery decides from the content on disk; a zombie's
late file operation never lands; a stopped item leaves no intent, staged file or lock behind.
"""

from __future__ import annotations

import os
import signal
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.exif import read_metadata
from photos.history import FOLDER as HISTORY  # kept originals (issue 31), not photos
from store.models import Intent, Item, Photo, PhotoLock
from tests.support import Fleet, events_of, items_of, job_done, pid_of_owner, wait_for

SHIFT = {"exif.shift": "+1h"}
RENAME = {"rename.pattern": "renamed_{taken:%Y%m%d_%H%M%S}{ext}"}


def one_photo(folder: Path) -> tuple[Path, datetime]:
    (photo,) = generate_samples(folder, 1, seed=23, size=(320, 240))
    taken = read_metadata(photo)["taken"]
    assert taken, "the sample photo has a capture time"
    return photo, datetime.fromisoformat(taken)


def files_in(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and HISTORY not in p.parts)


def photo_row(engine: Engine) -> Photo:
    with Session(engine) as s:
        (row,) = s.execute(select(Photo)).scalars().all()
        return row


def assert_photo_once(engine: Engine, folder: Path, taken: datetime, shifts: int) -> None:
    """Exactly one file, where the store says, shifted ``shifts`` hours; nothing staged or held."""
    files = files_in(folder)
    assert len(files) == 1, f"the photo must exist exactly once, found {files}"
    assert str(files[0]) == photo_row(engine).path, "the store knows where the photo is"
    got = datetime.fromisoformat(read_metadata(files[0])["taken"])
    assert got == taken + timedelta(hours=shifts), f"shifted {got - taken}, expected {shifts}h"
    with Session(engine) as s:
        assert s.execute(select(Intent).where(Intent.state == "recorded")).all() == []
        assert s.execute(select(PhotoLock)).all() == []


def frozen(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().split()[2] == "T"


def running_owner(engine: Engine, job: int) -> Item | None:
    items = items_of(engine, job)
    return items[0] if items and items[0].lease_owner else None


def rename_waited_or_ran(engine: Engine, rename_job: int) -> bool:
    """The rename job either finished or was deferred because the photo is locked."""
    (item,) = items_of(engine, rename_job)
    return job_done(engine, rename_job) or bool(events_of(engine, "item_deferred", item.id))


def exif_worker_dies_at(fleet: Fleet, failpoint: str, what: str) -> None:
    """Start the sweeper and an exif worker that dies at ``failpoint``; return once it has died."""
    fleet.start_sweeper()
    doomed = fleet.start_worker(["exif"], threads=1, env={"PHOTOJOBS_FAILPOINTS": failpoint})
    wait_for(lambda: doomed.poll() is not None, 90, what=f"the exif worker to die {what}")


def test_applied_but_unmarked_edit_is_never_applied_twice(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a photo taken at T and an EXIF job (+1h) whose worker dies right after applying the
    # edit, before marking its intent applied
    folder = tmp_path / "photos"
    photo, taken = one_photo(folder)
    client = Client(Settings.from_env(env))
    exif_job = client.submit(["exif"], [folder], SHIFT).job_id
    exif_worker_dies_at(fleet, "exif.after_apply", "after applying")
    (exif_item,) = items_of(engine, exif_job)
    wait_for(lambda: events_of(engine, "lease_expired", exif_item.id), 60, what="the lease to be revoked")
    # When another job renames the photo meanwhile, and then an exif worker comes back
    rename_job = client.submit(["rename"], [folder], RENAME).job_id
    fleet.start_worker(["rename"], threads=1)
    wait_for(lambda: rename_waited_or_ran(engine, rename_job), 90, what="the rename to run or wait")
    fleet.start_worker(["exif"], threads=1)
    wait_for(lambda: job_done(engine, exif_job) and job_done(engine, rename_job), 120, what="both jobs")
    # Then both jobs succeeded and the photo exists once, shifted exactly once (T+1h, never T+2h)
    assert [i.state for i in items_of(engine, exif_job)] == ["succeeded"]
    assert [i.state for i in items_of(engine, rename_job)] == ["succeeded"]
    assert_photo_once(engine, folder, taken, 1)
    assert photo_row(engine).path != str(photo), "the rename happened after the edit was settled"
    client.engine.dispose()


def test_frozen_editor_never_resurrects_the_old_path(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an EXIF attempt frozen (SIGSTOP) after staging its edit and recording its intent
    folder = tmp_path / "photos"
    photo, taken = one_photo(folder)
    client = Client(Settings.from_env(env))
    exif_job = client.submit(["exif"], [folder], SHIFT).job_id
    fleet.start_sweeper()
    zombie = fleet.start_worker(["exif"], threads=1, env={"PHOTOJOBS_FAILPOINTS": "exif.after_record:stop"})
    item = wait_for(lambda: running_owner(engine, exif_job), 60, what="the exif item to be claimed")
    owner = item.lease_owner
    wait_for(lambda: frozen(pid_of_owner(owner)), 60, what="the exif worker to freeze")
    wait_for(lambda: events_of(engine, "lease_expired", item.id), 60, what="its lease to be revoked")
    # When another job wants to rename the photo, and then the frozen attempt wakes up
    rename_job = client.submit(["rename"], [folder], RENAME).job_id
    fleet.start_worker(["rename"], threads=1)
    wait_for(lambda: rename_waited_or_ran(engine, rename_job), 90, what="the rename to run or wait")
    os.killpg(zombie.pid, signal.SIGCONT)

    zombie_refused = lambda: events_of(engine, "stale_commit_rejected", worker=owner)  # noqa: E731
    wait_for(zombie_refused, 60, what="the zombie's next commit to be refused")
    fleet.start_worker(["exif"], threads=1)
    wait_for(lambda: job_done(engine, exif_job) and job_done(engine, rename_job), 120, what="both jobs")
    # Then the photo exists exactly once (the old path did not come back), edited once, renamed
    assert [i.state for i in items_of(engine, exif_job)] == ["succeeded"]
    assert [i.state for i in items_of(engine, rename_job)] == ["succeeded"]
    assert not photo.exists(), "the old path reappeared"
    assert_photo_once(engine, folder, taken, 1)
    client.engine.dispose()


def test_cancelled_job_with_a_recorded_intent_frees_its_photo(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an EXIF job whose worker died right after recording its intent (staged file on disk)
    folder = tmp_path / "photos"
    photo, taken = one_photo(folder)
    client = Client(Settings.from_env(env))
    job = client.submit(["exif"], [folder], SHIFT).job_id
    exif_worker_dies_at(fleet, "exif.after_record", "after recording")
    # When the job is cancelled
    client.cancel(job)
    wait_for(lambda: job_done(engine, job), 60, what="the job to end")

    def settled() -> bool:
        with Session(engine) as s:
            live = s.execute(select(Intent).where(Intent.state == "recorded")).all()
            locks = s.execute(select(PhotoLock)).all()
        return not live and not locks and files_in(folder) == [photo]

    # Then its intent is settled, its staged file removed and its lock released …
    wait_for(settled, 60, what="the orphaned intent to be settled")
    assert [i.state for i in items_of(engine, job)] == ["cancelled"]
    with Session(engine) as s:
        assert [i.state for i in s.execute(select(Intent)).scalars()] == ["discarded"]
    # … so a later EXIF job on the same photo succeeds (no TargetTaken), applying its shift once
    again = client.submit(["exif"], [folder], SHIFT).job_id
    fleet.start_worker(["exif"], threads=1)
    wait_for(lambda: job_done(engine, again), 90, what="the second exif job")
    assert [i.state for i in items_of(engine, again)] == ["succeeded"], items_of(engine, again)[0].error
    assert_photo_once(engine, folder, taken, 1)
    client.engine.dispose()


def test_photo_changed_by_someone_else_during_recovery_fails_the_item_and_is_not_touched(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given an EXIF job whose worker died right after recording its intent (staged file on disk)
    folder = tmp_path / "photos"
    photo, _ = one_photo(folder)
    client = Client(Settings.from_env(env))
    job = client.submit(["exif"], [folder], SHIFT).job_id
    exif_worker_dies_at(fleet, "exif.after_record", "after recording")
    # And another program rewrites the photo meanwhile (neither the base nor the planned result)
    (edited,) = generate_samples(tmp_path / "elsewhere", 1, seed=99, size=(320, 240))
    outside = edited.read_bytes()
    photo.write_bytes(outside)
    # When the lease is revoked and an exif worker recovers the intent
    fleet.start_worker(["exif"], threads=1)
    wait_for(lambda: job_done(engine, job), 120, what="the exif job to end")
    # Then the item failed with a clear "changed by someone else", naming the photo …
    (item,) = items_of(engine, job)
    assert item.state == "failed", item.error
    assert "changed by someone else" in (item.error or "") and str(photo) in (item.error or "")
    # … and the photo is exactly what the other program wrote: no staged file, no intent, no lock
    assert files_in(folder) == [photo]
    assert photo.read_bytes() == outside
    with Session(engine) as s:
        assert [i.state for i in s.execute(select(Intent)).scalars()] == ["discarded"]
        assert s.execute(select(PhotoLock)).all() == []
    client.engine.dispose()
