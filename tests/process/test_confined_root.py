"""A root the jobs cannot leave (issue 37): real workers held at a ``:wait`` failpoint between their
plan and their act while the test swaps a folder for a symlink to an outside folder, and a real
``photojobs prune`` over a history store that is a symlink. Nothing outside is written, moved,
replaced or deleted; the photo stays inside, its item refused with an error naming the file.

One fleet per store serves the whole module (its own Redis and database): a worker on every lane
with every failpoint of the module armed; each test releases the points its jobs pass. The SQLite
fleet resolves paths with the component walk (``PHOTOJOBS_ROOTFS_WALK=1``), the PostgreSQL one with
``openat2``: both ways the product resolves are held to every hole."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.testing.samples import generate_samples
from photos.fileops import is_staged_name
from photos.history import FOLDER as HISTORY
from photos.rootfs import WALK_ENV
from store.engine import make_engine
from store.schema import upgrade
from tests.conftest import _fresh_pg, _worker_env
from tests.support import Fleet, RedisServer, items_of, photojobs, wait_for, wait_job_done

POINTS = ("exif.after_stage", "rename.after_stage", "archive.after_stage", "upload.after_stage",
          "upload.before_apply", "undo.rename.after_stage")  # fmt: skip
RENAME = "renamed_{taken:%Y%m%d_%H%M%S}{ext}"


@dataclass
class Rig:
    env: dict[str, str]
    engine: Engine
    gate: Path
    fleet: Fleet
    base: Path

    def submit(self, lanes: list[str], folder: Path, params: dict[str, Any]) -> int:
        return Client(Settings.from_env(self.env)).submit(lanes, [folder], params).job_id

    def undo(self, job: int) -> int:
        found = Client(Settings.from_env(self.env)).undo(job)["job"]
        assert found is not None
        return int(found)

    def through(self, job: int, *points: str, change: Callable[[], None] | None = None) -> None:
        """Let the job's worker past each of ``points`` in turn (each waits for the worker to hold
        there), making ``change`` at the last; wait for the job to end. The points are armed again
        for the next job."""
        try:
            for point in points:
                reached = self.gate / f"{point}.reached"
                wait_for(reached.exists, 120, what=f"job {job} at {point}\n{self.fleet.logs()}")
                if change is not None and point == points[-1]:
                    change()
                (self.gate / f"{point}.go").touch()
            wait_job_done(self.engine, job)
        finally:
            for point in points:
                (self.gate / f"{point}.reached").unlink(missing_ok=True)
                (self.gate / f"{point}.go").unlink(missing_ok=True)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    base = tmp_path_factory.mktemp("confined")
    redis = RedisServer(base / "redis")  # its own: no other test's worker takes these messages
    redis.start()
    dbs: Iterator[str] | None = None
    if request.param == "sqlite":
        url = f"sqlite:///{base / 'photojobs.db'}"
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
    else:
        dbs = _fresh_pg(request.getfixturevalue("pg_template"))
        url = next(dbs)
    env = _worker_env(url, redis.url)
    if request.param == "sqlite":
        env[WALK_ENV] = "1"  # the fallback walk (an old kernel, a seccomp filter refusing openat2)
    gate = base / "gate"
    gate.mkdir()
    (base / "logs").mkdir()
    fleet = Fleet(env, base / "logs")
    fleet.start_sweeper()
    fleet.start_worker(
        ["exif", "rename", "archive", "upload"],
        threads=1,
        env={
            "PHOTOJOBS_FAILPOINTS": ",".join(f"{point}:wait" for point in POINTS),
            "PHOTOJOBS_FAILPOINT_DIR": str(gate),
        },
    )
    engine = make_engine(url)
    try:
        yield Rig(env, engine, gate, fleet, base)
    finally:
        fleet.stop()
        engine.dispose()
        redis.stop()
        if dbs is not None:
            next(dbs, None)


@pytest.fixture
def place(rig: Rig, request: pytest.FixtureRequest) -> Path:
    """This test's own folder in the module's: photos, outputs and the outside folder."""
    folder = rig.base / request.node.name.replace("[", "-").replace("]", "")
    folder.mkdir()
    (folder / "outside").mkdir()
    (folder / "outside" / "report.txt").write_bytes(b"the outside folder's own file")
    return folder


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree(folder: Path) -> dict[str, str]:
    """Every name under ``folder``: a file's SHA-256 and inode, a symlink's target, or "dir"."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(folder))] = f"-> {os.readlink(p)}"
        elif p.is_file():
            out[str(p.relative_to(folder))] = f"{sha(p)} #{p.stat().st_ino}"
        else:
            out[str(p.relative_to(folder))] = "dir"
    return out


def one_photo(folder: Path) -> Path:
    (photo,) = generate_samples(folder, 1, seed=5, size=(64, 48))
    return photo


def swap(folder: Path, outside: Path) -> Path:
    """What an attacker who can write in the photo folder does: rename ``folder`` away (it stays
    inside) and put a symlink to ``outside`` in its place. Returns where the folder went."""
    moved = folder.with_name(folder.name + ".moved")
    if folder.exists():
        folder.rename(moved)
    folder.symlink_to(outside, target_is_directory=True)
    return moved


def the_error(rig: Rig, job: int) -> str:
    (item,) = items_of(rig.engine, job)
    assert item.state == "failed", (item.state, item.result, rig.fleet.logs())
    return item.error or ""


# -- the destination folder swapped between stage and apply ---------------------------------------
def test_a_rename_whose_destination_folder_became_a_symlink_moves_nothing_outside(
    rig: Rig, place: Path
) -> None:
    # Given a rename into dest/ planned and staged by a real worker (held after its stage)
    photos = place / "photos"
    photo = one_photo(photos / "album")
    before = sha(photo)
    job = rig.submit(["rename"], photos, {"rename.pattern": f"dest/{RENAME}"})
    outside = tree(place / "outside")
    # When dest/ appears as a symlink to an outside folder before the apply
    rig.through(job, "rename.after_stage", change=lambda: swap(photos / "dest", place / "outside"))
    # Then nothing reached the outside folder, the photo is where it was, and the item is refused
    # naming the folder
    assert tree(place / "outside") == outside
    assert sha(photo) == before
    assert "its folder dest is a symlink" in the_error(rig, job)


def test_an_archive_whose_root_became_a_symlink_moves_nothing_outside(rig: Rig, place: Path) -> None:
    # Given an archive move planned and staged by a real worker (held after its stage)
    photos = place / "photos"
    photo = one_photo(photos)
    before = sha(photo)
    job = rig.submit(["archive"], photos, {"archive.root": str(place / "archive")})
    outside = tree(place / "outside")
    # When the archive root is renamed away and a symlink to an outside folder put in its place
    rig.through(job, "archive.after_stage", change=lambda: swap(place / "archive", place / "outside"))
    # Then nothing reached the outside folder, the photo stays inside, and the item is refused
    # (the root is no longer a real folder)
    assert tree(place / "outside") == outside
    assert sha(photo) == before
    assert [p for p in (place / "archive.moved").rglob("*") if p.is_file()] == []
    assert "is no longer a real folder" in the_error(rig, job)


def test_a_local_upload_whose_folder_became_a_symlink_publishes_nothing_outside(
    rig: Rig, place: Path
) -> None:
    # Given a local upload staged by a real worker into uploads/<ab>/, recorded, its destination
    # checked again, and held right before its publish
    photos = place / "photos"
    photo = one_photo(photos)
    before = sha(photo)
    job = rig.submit(["upload"], photos, {"upload.target": str(place / "uploads")})
    planted: dict[str, str] = {}

    def attack() -> None:
        # the staged copy's folder renamed away, the copy moved into the outside folder, and a
        # symlink to it put in the folder's place: a path-based publish would link it there
        (staged,) = [p for p in (place / "uploads").rglob("*") if is_staged_name(p.name)]
        moved = swap(staged.parent, place / "outside")
        os.rename(moved / staged.name, place / "outside" / staged.name)
        planted.update(tree(place / "outside"))

    rig.through(job, "upload.after_stage", "upload.before_apply", change=attack)
    # Then nothing new is outside, the photo is intact, and the item is refused naming the folder
    assert tree(place / "outside") == planted and sha(photo) == before
    assert "is a symlink" in the_error(rig, job)


# -- the history store ----------------------------------------------------------------------------
def test_an_exif_edit_with_a_symlinked_history_store_is_refused_and_keeps_nothing_outside(
    rig: Rig, place: Path
) -> None:
    # Given a photo root whose .photojobs-history is a symlink to an outside folder
    photos = place / "photos"
    photo = one_photo(photos)
    before = sha(photo)
    (photos / HISTORY).symlink_to(place / "outside", target_is_directory=True)
    outside = tree(place / "outside")
    # When a real worker edits the photo's metadata
    job = rig.submit(["exif"], photos, {"exif.rating": 5})
    rig.through(job, "exif.after_stage")
    # Then no original is kept outside, and the edit is refused naming the store, untouched (no
    # staged file left)
    assert tree(place / "outside") == outside
    error = the_error(rig, job)
    assert f"{photos / HISTORY}: the history store is a symlink or not a folder" in error, error
    assert sha(photo) == before
    assert sorted(p.name for p in photos.iterdir()) == sorted([photo.name, HISTORY])


def test_prune_skips_a_symlinked_history_store_in_an_upload_folder_and_deletes_nothing_outside(
    rig: Rig, place: Path
) -> None:
    # Given a finished local upload, and in its folder a .photojobs-history planted as a symlink to
    # an outside folder holding files in content-addressed places and others (an id_rsa, a report)
    photos = place / "photos"
    one_photo(photos)
    job = rig.submit(["upload"], photos, {"upload.target": str(place / "uploads")})
    rig.through(job, "upload.after_stage", "upload.before_apply")
    assert {i.state for i in items_of(rig.engine, job)} == {"succeeded"}
    victims = place / "outside" / "ab"
    victims.mkdir()
    for name in ("ab" + "0" * 62, "id_rsa", "report.txt"):
        (victims / name).write_bytes(b"not the store's")
    (place / "uploads" / HISTORY).symlink_to(place / "outside", target_is_directory=True)
    outside = tree(place / "outside")
    # When a routine prune runs with a retention every one of those files is past
    done = photojobs({**rig.env, "PHOTOJOBS_HISTORY_KEEP": "0s"}, "prune", "--older-than", "30d")
    # Then it succeeds, deletes nothing outside, and names the store it skipped
    assert done.returncode == 0, done.stderr
    assert tree(place / "outside") == outside
    assert f"skipped the history store {place / 'uploads' / HISTORY}: it is a symlink" in done.stderr


# -- the photo's folder swapped during an exif apply ----------------------------------------------
def test_an_exif_apply_whose_folder_became_a_symlink_replaces_no_outside_file(rig: Rig, place: Path) -> None:
    # Given a real worker that wrote the edited copy next to the photo (held after its stage)
    photos = place / "photos"
    photo = one_photo(photos / "album")
    before = sha(photo)
    job = rig.submit(["exif"], photos, {"exif.rating": 5})
    planted: dict[str, str] = {}

    def attack() -> None:
        # the outside folder gets second names of the photo and of the staged copy (the photo's
        # name there is still the photo it pinned), then album/ becomes a symlink to it: a
        # path-based replace would replace outside/IMG with the edit
        album = photos / "album"
        for f in album.iterdir():
            os.link(f, place / "outside" / f.name)
        swap(album, place / "outside")
        planted.update(tree(place / "outside"))

    rig.through(job, "exif.after_stage", change=attack)
    # Then no outside file is replaced, the photo is untouched, and the item is refused naming the
    # folder
    assert tree(place / "outside") == planted
    assert sha(photos / "album.moved" / photo.name) == before
    assert "its folder album is a symlink" in the_error(rig, job)


# -- an undo's old folder swapped -----------------------------------------------------------------
def test_an_undo_whose_old_folder_became_a_symlink_moves_nothing_outside(rig: Rig, place: Path) -> None:
    # Given a photo renamed out of album/ into sorted/, and an undo of that rename held by a real
    # worker after it staged its move back
    photos = place / "photos"
    one_photo(photos / "album")
    job = rig.submit(["rename"], photos, {"rename.pattern": f"sorted/{RENAME}"})
    rig.through(job, "rename.after_stage")
    (renamed,) = (photos / "sorted").iterdir()
    before = sha(renamed)
    undo = rig.undo(job)
    outside = tree(place / "outside")
    # When album/ (the old folder) is replaced by a symlink to an outside folder before the apply
    rig.through(undo, "undo.rename.after_stage", change=lambda: swap(photos / "album", place / "outside"))
    # Then nothing reached the outside folder, the photo stays where the rename put it, and the undo
    # item is refused naming the folder
    assert tree(place / "outside") == outside
    assert sha(renamed) == before
    assert "its folder album is a symlink" in the_error(rig, undo)
