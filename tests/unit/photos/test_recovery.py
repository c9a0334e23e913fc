"""photos.recovery: an intent's fate decided from the disk, with the staged file consumed first."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from photos import fileops
from photos.recovery import (
    APPLIED,
    CONFLICT,
    DISCARDED,
    REPLAN,
    Effect,
    link_staged,
    settle_on_disk,
)
from photos.rootfs import Roots


@pytest.fixture
def fs(tmp_path: Path) -> Roots:
    """The test's folder as the root every file operation acts beneath."""
    return Roots([tmp_path])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if fileops.is_staged_name(p.name))


@pytest.fixture
def edit(tmp_path: Path) -> tuple[Path, Path, Effect]:
    """A photo holding BASE and a staged edit holding RESULT, as an exif attempt leaves them."""
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"BASE")
    staged = fileops.staged_path(photo, "i1-t1")
    staged.write_bytes(b"RESULT")
    effect = Effect("replace", str(staged), str(photo), str(photo), sha(b"BASE"), sha(b"RESULT"))
    return photo, staged, effect


def test_target_has_base_and_staged_exists_applies(
    edit: tuple[Path, Path, Effect], tmp_path: Path, fs: Roots
) -> None:
    # Given an edit recorded but not applied / When recovery may apply / Then it applies it once
    photo, staged, effect = edit
    verdict = settle_on_disk(effect, may_apply=True, tag="i1-t2", within=fs)
    assert (verdict.state, verdict.applied_now) == (APPLIED, True)
    assert photo.read_bytes() == b"RESULT" and not staged.exists() and leftovers(tmp_path) == []


def test_target_has_result_is_marked_applied_and_never_applied_again(
    edit: tuple[Path, Path, Effect], tmp_path: Path, fs: Roots
) -> None:
    # Given an edit that was applied before its attempt died (the staged file is gone)
    photo, staged, effect = edit
    os.replace(staged, photo)
    # When recovery runs / Then it is applied, and the photo is left alone
    verdict = settle_on_disk(effect, may_apply=True, tag="i1-t2", within=fs)
    assert (verdict.state, verdict.applied_now) == (APPLIED, False)
    assert photo.read_bytes() == b"RESULT"


def test_target_has_base_and_no_staged_file_replans(edit: tuple[Path, Path, Effect], fs: Roots) -> None:
    # Given an edit whose staged file was removed / When recovery runs / Then it must be redone
    photo, staged, effect = edit
    staged.unlink()
    assert settle_on_disk(effect, may_apply=True, tag="t", within=fs).state == REPLAN
    assert photo.read_bytes() == b"BASE"


def test_target_changed_by_someone_else_touches_nothing(
    edit: tuple[Path, Path, Effect], tmp_path: Path, fs: Roots
) -> None:
    # Given a photo another program rewrote after the edit was planned
    photo, staged, effect = edit
    photo.write_bytes(b"OTHER")
    # When recovery runs / Then it refuses with a clear message and leaves the photo as it is
    verdict = settle_on_disk(effect, may_apply=True, tag="t", within=fs)
    assert verdict.state == CONFLICT
    assert verdict.note == f"changed by someone else: {photo} expected {sha(b'BASE')} found {sha(b'OTHER')}"
    assert photo.read_bytes() == b"OTHER" and leftovers(tmp_path) == []


def test_stopped_item_discards_without_applying_and_the_zombie_finds_nothing(
    edit: tuple[Path, Path, Effect], tmp_path: Path, fs: Roots
) -> None:
    # Given an edit recorded by an attempt that is frozen (a zombie) and whose item stopped
    photo, staged, effect = edit
    # When the sweeper settles it (not allowed to apply)
    verdict = settle_on_disk(effect, may_apply=False, tag="sweep", within=fs)
    # Then it is discarded, the staged file is gone, and the zombie's late replace fails
    assert verdict.state == DISCARDED and leftovers(tmp_path) == []
    with pytest.raises(FileNotFoundError):
        fileops.replace_atomic(staged, photo, within=fs)
    assert photo.read_bytes() == b"BASE"


def test_move_through_a_staged_link_recovers_and_a_zombie_cannot_move_later(
    tmp_path: Path, fs: Roots
) -> None:
    # Given a rename recorded with a staged hard link of the photo
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"PHOTO")
    link = link_staged(photo, "i2-t1", within=fs)
    assert link is not None and os.path.samefile(link, photo)
    target = tmp_path / "b.jpg"
    effect = Effect("move", str(link), str(target), str(photo), sha(b"PHOTO"), sha(b"PHOTO"))
    # When a stopped item's intent is settled without applying
    assert settle_on_disk(effect, may_apply=False, tag="sweep", within=fs).state == DISCARDED
    # Then the photo stays where it was and a zombie's late move of its link finds nothing
    with pytest.raises(FileNotFoundError):
        fileops.move_no_clobber(link, target, within=fs)
    assert photo.read_bytes() == b"PHOTO" and not target.exists() and leftovers(tmp_path) == []
    # And when a recovering attempt may apply, the photo moves exactly once
    link = link_staged(photo, "i2-t2", within=fs)
    assert link is not None
    effect = Effect("move", str(link), str(target), str(photo), sha(b"PHOTO"), sha(b"PHOTO"))
    assert settle_on_disk(effect, may_apply=True, tag="i2-t3", within=fs).state == APPLIED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jpg"]


def test_half_done_move_is_finished(tmp_path: Path, fs: Roots) -> None:
    # Given a move whose target was linked but whose old name was not yet removed
    photo = tmp_path / "a.jpg"
    photo.write_bytes(b"PHOTO")
    link = link_staged(photo, "i3-t1", within=fs)
    assert link is not None
    target = tmp_path / "b.jpg"
    os.link(link, target)
    effect = Effect("move", str(link), str(target), str(photo), sha(b"PHOTO"), sha(b"PHOTO"))
    # When recovery runs / Then it is applied and the photo exists once, at the target
    assert settle_on_disk(effect, may_apply=True, tag="i3-t2", within=fs).state == APPLIED
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jpg"]
