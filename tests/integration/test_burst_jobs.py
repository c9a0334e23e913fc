"""A combined exif + rename + archive job over bursts (shots sharing a capture second and camera,
so their names collide), and its undo (issue 39). SQLite and PostgreSQL, real files and ExifTool;
each lane's own code run item by item in the test's process, in an order the test chooses
(``tests.inline_lanes``), with a failpoint hook to run another item inside an item's step gap."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from middleware import failpoints
from photojobs.api import Client
from photojobs.config import Settings
from photos.errors import PhotoError
from store.models import Item, Photo
from tests.burst_support import PARAMS, bursts, fresh, items_by_photo, run_photo_by_photo, shot, tree
from tests.inline_lanes import run_item
from tests.support import unavailable


@pytest.fixture
def on_failpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Callable[[], None]]]:
    """{failpoint name: a callable run once when it is hit} in this process."""
    hooks: dict[str, Callable[[], None]] = {}
    real = failpoints.hit

    def hit(name: str) -> None:
        hook = hooks.pop(name, None)
        if hook is not None:
            hook()
        real(name)

    monkeypatch.setattr(failpoints, "hit", hit)
    yield hooks


@pytest.fixture
def client(engine: Engine) -> Iterator[Client]:
    c = Client(Settings.from_env({}), engine=engine)
    yield c
    c.engine.dispose()


def test_a_shot_renamed_into_the_name_its_burst_mate_is_just_leaving_is_found_by_its_archive(
    engine: Engine, client: Client, tmp_path: Path, on_failpoint: dict[str, Callable[[], None]]
) -> None:
    # Given two shots of one second and camera, shifted, renamed and archived by one job
    folder = tmp_path / "card"
    folder.mkdir()
    shot(folder / "IMG_1.jpg", 40)
    shot(folder / "IMG_2.jpg", 200)
    job = client.submit(["exif", "rename", "archive"], [folder], PARAMS).job_id
    items = items_by_photo(engine, job)
    for name in ("IMG_1.jpg", "IMG_2.jpg"):
        run_item(engine, items["exif", name])
    first = run_item(engine, fresh(engine, items["rename", "IMG_1.jpg"]))
    base = Path(str(first["target"])).name
    # When IMG_2 is renamed in the gap of IMG_1's archive: IMG_1's file has left the name IMG_2's
    # pattern renders (moved to the archive), its photo row not yet moved after it
    seen: dict[str, Any] = {}
    on_failpoint["archive.after_apply"] = lambda: seen.update(
        renamed=run_item(engine, fresh(engine, items["rename", "IMG_2.jpg"]))
    )
    run_item(engine, fresh(engine, items["archive", "IMG_1.jpg"]))
    # Then IMG_2 does not take that name (its row could not follow it there), and its archive item
    # finds it where its rename put it: no "file not found (deleted or moved after submission)"
    archived = run_item(engine, fresh(engine, items["archive", "IMG_2.jpg"]))
    assert Path(str(archived["target"])).is_file()
    assert Path(str(seen["renamed"]["target"])).name != base
    assert tree(folder) == {}
    with Session(engine) as s:
        paths = set(s.execute(select(Photo.path)).scalars())
    assert all(Path(p).is_file() for p in paths), paths


def run_all(engine: Engine, job: int, order: Callable[[list[Item]], list[Item]]) -> list[Any]:
    """Run the job's items until none is left to run: each round the pending ones in ``order``
    (an item deferred goes back to pending and runs in a later round). Returns every outcome."""
    outcomes: list[Any] = []
    for _ in range(50):
        with Session(engine) as s:
            pending = list(
                s.execute(select(Item).where(Item.job_id == job, Item.state == "pending")).scalars()
            )
            for item in pending:
                s.expunge(item)
        if not pending:
            return outcomes
        for item in order(pending):
            if fresh(engine, item).state != "pending":
                continue
            try:
                outcomes.append(run_item(engine, fresh(engine, item), fail_refused=True))
            except PhotoError as exc:
                outcomes.append(exc)
    raise AssertionError("the job's items did not end in 50 rounds")


def test_a_burst_job_whose_names_were_freed_and_reused_is_undone_with_no_retry(
    engine: Engine, client: Client, tmp_path: Path
) -> None:
    # Given six shots: two bursts of three (one second, one camera each), shifted, renamed and
    # archived by one job, each photo's lanes run to the end before the next photo's — so a name a
    # shot's archive freed is taken again by the next shot's rename
    folder = tmp_path / "card"
    bursts(folder, 6)
    originals = tree(folder)
    job = client.submit(["exif", "rename", "archive"], [folder], PARAMS).job_id
    lanes = ["exif", "rename", "archive"]
    renamed = run_photo_by_photo(engine, job, [f"IMG_{n}.jpg" for n in range(6)], lanes)
    assert len(set(renamed)) == 2, renamed  # each burst reused one name: freed by its archive
    # When the job is undone, its items taken in the order they were made (the photos' first:
    # the burst's earliest shot moves back first, into the name a later shot still holds)
    undo = client.undo(job)
    outcomes = run_all(engine, undo["job"], lambda pending: sorted(pending, key=lambda i: i.id))
    # Then every shot is back at its name, byte for byte, with no refusal and no failed item
    assert [o for o in outcomes if isinstance(o, PhotoError)] == []
    assert tree(folder) == originals
    with Session(engine) as s:
        states = set(s.execute(select(Item.state).where(Item.job_id == undo["job"])).scalars())
    assert states == {"succeeded"}


def test_two_shots_moving_back_into_one_freed_name_at_once_wait_for_each_other_instead_of_failing(
    engine: Engine, client: Client, tmp_path: Path, on_failpoint: dict[str, Callable[[], None]]
) -> None:
    # Given two shots of one burst, shifted, renamed and archived photo by photo (each took the
    # name the other's archive had freed), and the job's undo
    folder = tmp_path / "card"
    bursts(folder, 2, size=2)
    originals = tree(folder)
    job = client.submit(["exif", "rename", "archive"], [folder], PARAMS).job_id
    renamed = run_photo_by_photo(engine, job, ["IMG_0.jpg", "IMG_1.jpg"], ["exif", "rename", "archive"])
    assert len(set(renamed)) == 1, renamed
    undo = client.undo(job)
    items = {(i.lane, i.photo_id): i for i in _items(engine, undo["job"])}
    photos = sorted({p for _, p in items})
    # When the first shot's archive undo has looked at the freed name and staged its move back, and
    # the second shot's archive undo moves into that name before the first one's move lands (two
    # workers racing: the look and the move are not one step)
    raced: dict[str, Any] = {}
    on_failpoint["undo.archive.after_stage"] = lambda: raced.update(
        second=run_item(engine, fresh(engine, items["archive", photos[1]]))
    )
    first = run_item(engine, fresh(engine, items["archive", photos[0]]), fail_refused=True)
    # Then the first, finding the name now named by the second's row when it records its move
    # (``TargetTaken``), waits for the second's own undo to move it away (deferred, not refused),
    # and the undo ends whole: every shot back at its name, byte for byte, no item failed
    assert raced["second"].get("undone") == 1, raced
    assert "deferred" in first, first
    outcomes = run_all(engine, undo["job"], lambda pending: sorted(pending, key=lambda i: i.id))
    assert [o for o in outcomes if isinstance(o, PhotoError)] == []
    assert tree(folder) == originals
    with Session(engine) as s:
        states = set(s.execute(select(Item.state).where(Item.job_id == undo["job"])).scalars())
    assert states == {"succeeded"}


def _items(engine: Engine, job: int) -> list[Item]:
    with Session(engine) as s:
        rows = list(s.execute(select(Item).where(Item.job_id == job)).scalars())
        for r in rows:
            s.expunge(r)
    return rows


@pytest.fixture(autouse=True)
def _needs_exiftool() -> None:
    if subprocess.run(["which", "exiftool"], capture_output=True).returncode != 0:
        unavailable("needs exiftool")
