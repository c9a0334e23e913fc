"""A photo replaced by a symlink to an outside file right after its containment check (issue 20):
everything read of it afterwards reads the file that was checked (``containment.pin_inside``), and
recovery never follows a symlink when it hashes. Real files, real exiftool, real Pillow."""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from PIL import Image

from photojobs.testing.samples import generate_samples
from photos import containment, exiftool, recovery, rootfs
from photos.analyze import analyze
from photos.containment import pin_inside
from photos.errors import OutsideRoot, PhotoError
from photos.exif import ExifEdit, read_metadata, write_metadata
from tests.support import unavailable


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def scene(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(root, the photo inside it: 64x48, an outside JPEG: 32x24)."""
    root = tmp_path / "photos"
    (photo,) = generate_samples(root, 1, seed=1, size=(64, 48))
    (outside,) = generate_samples(tmp_path / "outside", 1, seed=9, size=(32, 24))
    return root, photo, outside


def swap(photo: Path, outside: Path) -> None:
    """The attack: the photo's name now is a symlink to a file outside the roots."""
    photo.unlink()
    photo.symlink_to(outside)


def test_bytes_read_through_the_pin_after_a_swap_are_the_checked_photos(
    scene: tuple[Path, Path, Path],
) -> None:
    # Given a photo pinned inside its root
    root, photo, outside = scene
    original = photo.read_bytes()
    with pin_inside(photo, [root]) as pinned:
        # When its path is swapped for a symlink to an outside JPEG right after the check
        swap(photo, outside)
        # Then the pinned name, its hash and an analysis all read the checked photo, not the outside one
        assert pinned.name.read_bytes() == original
        assert pinned.sha256() == hashlib.sha256(original).hexdigest()
        facts = analyze(pinned.name)
        assert (facts["width"], facts["height"], facts["sha256"]) == (64, 48, pinned.sha256())
        # And the pin knows the path no longer holds what it checked
        assert not pinned.still_at()
    # And the private name is gone afterwards
    assert not os.path.lexists(pinned.name)


def test_exiftool_given_the_pinned_name_after_a_swap_reads_and_copies_the_checked_photo(
    scene: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    if not exiftool.available():
        unavailable("exiftool is not installed")
    # Given a photo pinned inside its root, its path then swapped for a symlink to an outside JPEG
    root, photo, outside = scene
    outside_before = sha(outside)
    staged = root / ".edit.pj-test.tmp"
    with pin_inside(photo, [root]) as pinned:
        swap(photo, outside)
        # When exiftool writes an edited copy of the pinned name
        write_metadata(pinned.name, staged, ExifEdit.from_params({"rating": 4}))
    # Then the copy is the checked 64x48 photo, with the edit, and the outside file is untouched
    with Image.open(staged) as img:
        assert img.size == (64, 48)
    assert read_metadata(staged)["rating"] == 4
    assert sha(outside) == outside_before


def test_a_hard_link_made_from_the_pin_after_a_swap_is_the_checked_file_not_the_symlink(
    scene: tuple[Path, Path, Path],
) -> None:
    # Given a photo pinned inside its root, then a second name of it (another attempt's staged link)
    # and its own name swapped for a symlink to an outside JPEG
    root, photo, outside = scene
    original = photo.read_bytes()
    keep = root / "keep.jpg"
    os.link(photo, keep)  # the inode stays linked, as a photo with a staged link is
    with pin_inside(photo, [root]) as pinned:
        swap(photo, outside)
        # When the pinned file is hard-linked to a new name (what a move's staged link is)
        staged = root / ".p.jpg.pj-test.tmp"
        with rootfs.open_root(root) as opened:
            rootfs.link_open_file(pinned.fd, opened, staged.name)
    # Then that name is the checked file itself: a regular file with the photo's bytes
    assert not staged.is_symlink()
    assert staged.read_bytes() == original
    assert os.path.samefile(staged, keep)


def test_a_path_that_resolves_outside_is_never_pinned(scene: tuple[Path, Path, Path]) -> None:
    # Given a photo path that is already a symlink to an outside file
    root, photo, outside = scene
    swap(photo, outside)
    # When it is pinned, Then it is refused as outside the photo roots
    with pytest.raises(OutsideRoot, match="outside the photo roots"):
        with pin_inside(photo, [root]):
            pass


def test_errors_about_the_pinned_name_name_the_photo(tmp_path: Path) -> None:
    # Given a "photo" that is text, pinned
    root = tmp_path / "photos"
    root.mkdir()
    photo = root / "notes.jpg"
    photo.write_text("not an image at all\n" * 10)
    # When analysing the pinned name fails
    with pytest.raises(PhotoError) as caught:
        with pin_inside(photo, [root]) as pinned, pinned.as_photo():
            analyze(pinned.name)
    # Then the error names the photo's path, not the private name
    assert caught.value.path == str(photo)
    assert "pj-pin-" not in str(caught.value)


def test_recovery_never_hashes_what_a_symlink_points_to(scene: tuple[Path, Path, Path]) -> None:
    # Given a recorded target/source name swapped for a symlink to an outside file
    _root, photo, outside = scene
    swap(photo, outside)
    # When recovery asks what content is at that name
    # Then there is none: the outside file is not read
    assert recovery.content_of(photo, within=rootfs.Roots([_root])) is None
    # And a moved source that is such a symlink now is not dropped on the strength of what it
    # points to (the move's target holding the same bytes as the outside file)
    target = photo.parent / "moved.jpg"
    target.write_bytes(outside.read_bytes())
    recovery.drop_moved_source(str(photo), str(target), sha(outside), within=rootfs.Roots([_root]))
    assert photo.is_symlink()


def test_the_private_folder_of_a_dead_process_is_swept_and_a_live_ones_is_kept(
    scene: tuple[Path, Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given, in the temp folder, the pin folders of a process that died (SIGKILLed before it could
    # remove them) and of this live process, in both layouts: a folder per pin holding its link
    # (older releases) and a folder per process named by its pid, holding a folder per pin
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    dead = subprocess.Popen(["true"])
    dead.wait()
    for pid, name in ((dead.pid, "pj-pin-dead"), (os.getpid(), "pj-pin-live")):
        (tmp / name).mkdir()
        (tmp / name / "IMG_0001.jpg").symlink_to(f"/proc/{pid}/fd/7")
    for pid, name in ((dead.pid, f"pj-pin-{dead.pid}-x1y2z3"), (os.getpid(), f"pj-pin-{os.getpid()}-a1b2c3")):
        (tmp / name / "3").mkdir(parents=True)
        (tmp / name / "3" / "IMG_0002.jpg").symlink_to(f"/proc/{pid}/fd/8")
    monkeypatch.setattr(containment, "_swept", set())
    monkeypatch.setattr(containment, "_pin_folders", {})
    # When this process pins a photo for the first time
    root, photo, _outside = scene
    with pin_inside(photo, [root]) as pinned:
        mine = pinned.name.parent.parent
    # Then the dead process's folders are gone and the live ones are kept, with this process's own
    # pin folder, holding no name now that its pin is closed
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        ["pj-pin-live", f"pj-pin-{os.getpid()}-a1b2c3", mine.name]
    )
    assert mine.name.startswith(f"pj-pin-{os.getpid()}-")
    assert [p for p in mine.rglob("*") if not p.is_dir()] == []


def test_a_pin_is_a_private_name_for_the_opened_file_and_leaves_nothing_behind(
    scene: tuple[Path, Path, Path],
) -> None:
    # Given a photo inside the roots
    root, photo, _outside = scene
    # When it is pinned twice at once (two threads of a worker pin photos of the same name)
    with pin_inside(photo, [root]) as one, pin_inside(photo, [root]) as two:
        names = (one.name, two.name)
        # Then each pin has its own name, a link to its own descriptor, in a folder only this
        # process's user can enter
        assert one.name != two.name and one.name.name == two.name.name == photo.name
        assert os.readlink(one.name) == f"/proc/{os.getpid()}/fd/{one.fd}"
        assert os.readlink(two.name) == f"/proc/{os.getpid()}/fd/{two.fd}"
        assert stat.S_IMODE(os.stat(one.name.parent.parent).st_mode) == 0o700
        assert one.name.read_bytes() == photo.read_bytes()
    # And once closed, neither name is left, nor the folder made for the second
    for name in names:
        assert not os.path.lexists(name)
    assert not names[1].parent.exists() and stat.S_IMODE(os.stat(names[0].parent).st_mode) == 0o700
