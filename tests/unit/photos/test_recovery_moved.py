"""photos.recovery: a move that landed and was then changed by someone else is a conflict that
says where the photo is (issue 22), while a move that did not land stays a plain conflict."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from photos import fileops
from photos.recovery import APPLIED, CONFLICT, DISCARDED, Effect, link_staged, settle_on_disk
from photos.rootfs import Roots


@pytest.fixture
def fs(tmp_path: Path) -> Roots:
    """The test's folder as the root every file operation acts beneath."""
    return Roots([tmp_path])


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def planned_move(tmp_path: Path) -> tuple[Path, Path, Path, Effect]:
    """A photo holding PHOTO, the attempt's staged hard link of it and the recorded move to b.jpg."""
    src, target = tmp_path / "a.jpg", tmp_path / "b.jpg"
    src.write_bytes(b"PHOTO")
    staged = link_staged(src, "i1-t1", within=Roots([tmp_path]))
    assert staged is not None, "the test filesystem makes hard links"
    effect = Effect("move", str(staged), str(target), str(src), sha(b"PHOTO"), sha(b"PHOTO"))
    return src, staged, target, effect


def land(staged: Path, src: Path, target: Path) -> None:
    """What apply_and_mark does: the staged link becomes the target, then the source name goes."""
    os.rename(staged, target)
    src.unlink()


def test_move_landed_then_edited_is_a_conflict_naming_the_new_place(tmp_path: Path, fs: Roots) -> None:
    # Given a move that landed (staged link -> target, source name dropped) before its attempt died
    src, staged, target, effect = planned_move(tmp_path)
    land(staged, src, target)
    # And another program rewrote the moved photo (a new file in its place, as exiftool does)
    edited = tmp_path / "b.jpg.new"
    edited.write_bytes(b"EDITED")
    os.replace(edited, target)
    # When recovery runs (a worker's, which may apply, and the sweeper's, which may not)
    for may_apply in (True, False):
        verdict = settle_on_disk(effect, may_apply=may_apply, tag="i1-t2", within=fs)
        # Then it is a conflict naming the target, saying the move landed and what is there now
        assert verdict.state == CONFLICT
        assert (verdict.moved, verdict.content, verdict.settles_as) == (True, sha(b"EDITED"), APPLIED)
        assert verdict.note.startswith(f"changed by someone else: {target} expected {sha(b'PHOTO')}")
        assert f"moved there from {src}" in verdict.note
    # And nothing on disk was touched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.jpg"]
    assert target.read_bytes() == b"EDITED"


def test_move_landed_old_name_not_yet_dropped_then_edited_follows_the_target_and_keeps_the_old_name(
    tmp_path: Path, fs: Roots
) -> None:
    # Given a move that landed (staged link -> target) but whose attempt died before dropping the
    # photo's old name, and another program rewrote the photo at the target afterwards
    src, staged, target, effect = planned_move(tmp_path)
    os.rename(staged, target)
    edited = tmp_path / "b.jpg.new"
    edited.write_bytes(b"EDITED")
    os.replace(edited, target)
    # When recovery runs
    verdict = settle_on_disk(effect, may_apply=True, tag="i1-t2", within=fs)
    # Then it is a conflict saying the photo is at the target, and that the old name is left alone
    assert (verdict.state, verdict.moved, verdict.content) == (CONFLICT, True, sha(b"EDITED"))
    assert str(target) in verdict.note and f"{src} still holds the photo as it was moved" in verdict.note
    # And nothing was touched: the old name keeps the bytes as they were moved, no second move
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.jpg", "b.jpg"]
    assert (src.read_bytes(), target.read_bytes()) == (b"PHOTO", b"EDITED")


def test_source_edited_before_the_move_is_a_plain_conflict(tmp_path: Path, fs: Roots) -> None:
    # Given a move recorded but not applied, and the photo rewritten at its old name meanwhile
    src, staged, target, effect = planned_move(tmp_path)
    replacement = tmp_path / "a.jpg.new"
    replacement.write_bytes(b"EDITED")
    os.replace(replacement, src)
    # When recovery runs / Then the photo did not move: a conflict on the source, the row stays
    verdict = settle_on_disk(effect, may_apply=True, tag="i1-t2", within=fs)
    assert (verdict.state, verdict.moved, verdict.settles_as) == (CONFLICT, False, DISCARDED)
    assert str(src) in verdict.note
    assert src.read_bytes() == b"EDITED" and not target.exists()
    assert [p.name for p in tmp_path.iterdir() if fileops.is_staged_name(p.name)] == []


def test_source_gone_and_target_free_is_a_plain_conflict(tmp_path: Path, fs: Roots) -> None:
    # Given a move whose photo someone deleted (or took elsewhere) before the move, nothing at target
    src, staged, target, effect = planned_move(tmp_path)
    staged.unlink()
    src.unlink()
    # When recovery runs / Then it is a conflict that claims no new place for the photo
    verdict = settle_on_disk(effect, may_apply=False, tag="sweep1", within=fs)
    assert (verdict.state, verdict.moved) == (CONFLICT, False)


def test_source_gone_but_staged_link_left_is_not_taken_for_a_landed_move(tmp_path: Path, fs: Roots) -> None:
    # Given a move not applied (its staged link is still there), the source name removed by someone,
    # and another file created at the planned target
    src, staged, target, effect = planned_move(tmp_path)
    src.unlink()
    target.write_bytes(b"SOMEONE ELSE'S")
    # When recovery runs / Then it is a plain conflict: the file at the target is not our photo
    verdict = settle_on_disk(effect, may_apply=True, tag="i1-t2", within=fs)
    assert (verdict.state, verdict.moved) == (CONFLICT, False)
    assert target.read_bytes() == b"SOMEONE ELSE'S"


def test_legacy_move_landed_then_edited_is_a_conflict_naming_the_new_place(tmp_path: Path, fs: Roots) -> None:
    # Given a move recorded without a staged link (the photo itself is the source) that landed
    src, target = tmp_path / "a.jpg", tmp_path / "b.jpg"
    src.write_bytes(b"PHOTO")
    effect = Effect("move", str(src), str(target), str(src), None, sha(b"PHOTO"))
    os.rename(src, target)
    # And the moved photo was rewritten afterwards
    target.write_bytes(b"EDITED")
    # When recovery runs / Then it is a conflict that says the photo is at the target now
    verdict = settle_on_disk(effect, may_apply=False, tag="sweep1", within=fs)
    assert (verdict.state, verdict.moved, verdict.content) == (CONFLICT, True, sha(b"EDITED"))
    assert str(target) in verdict.note
