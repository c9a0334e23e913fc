"""The confined root (issue 37): every path resolved beneath a held folder, no symlink followed; the
safe-file protocol on it leaves nothing outside when a folder is swapped for a symlink. Each test
runs both ways the product resolves: ``openat2`` (Linux 5.6+) and the ``O_NOFOLLOW`` walk."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from photos import fileops, history, recovery, rootfs
from photos.errors import OutsideRoot
from photos.rootfs import NotBeneath, Roots
from tests.support import unavailable


@pytest.fixture(params=["openat2", "walk"], autouse=True)
def resolving(request: pytest.FixtureRequest) -> Iterator[str]:
    """Resolve with openat2 (where the kernel has it) or with the component walk."""
    if request.param == "openat2":
        rootfs.use_openat2(None)
        if not rootfs.openat2_available():
            unavailable(f"openat2 (Linux 5.6+); this kernel is {os.uname().release}")
    else:
        rootfs.use_openat2(False)
    yield request.param
    rootfs.use_openat2(None)


@pytest.fixture
def scene(tmp_path: Path) -> tuple[Path, Path]:
    """A root and, beside it, an outside folder holding a file that must never change."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "keep.txt").write_bytes(b"outside")
    return root, outside


def tree(folder: Path) -> dict[str, bytes | str]:
    """Every name under ``folder`` with its bytes (or where a symlink points)."""
    out: dict[str, bytes | str] = {}
    for p in sorted(folder.rglob("*")):
        rel = str(p.relative_to(folder))
        out[rel] = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


def swap_for_symlink(folder: Path, outside: Path) -> Path:
    """Rename ``folder`` away (it stays inside) and put a symlink to ``outside`` in its place."""
    moved = folder.with_name(folder.name + ".moved")
    folder.rename(moved)
    folder.symlink_to(outside, target_is_directory=True)
    return moved


# -- resolution ----------------------------------------------------------------------------------
def test_the_mode_asked_for_is_the_one_used(resolving: str) -> None:
    # Given the resolution mode of this run / Then it is the one the module reports
    assert rootfs.openat2_available() is (resolving == "openat2")


def test_a_folder_that_is_a_symlink_is_refused_naming_it_not_where_it_leads(scene: tuple[Path, Path]) -> None:
    # Given a root holding a folder that is a symlink to an outside folder, and a file in the way
    root, outside = scene
    (root / "a").mkdir()
    (root / "a" / "link").symlink_to(outside, target_is_directory=True)
    (root / "a" / "file").write_bytes(b"x")
    with rootfs.open_root(root) as r:
        # When a path through each is opened, listed, created or removed
        for action in (
            lambda: r.opendir("a/link"),
            lambda: r.opendir("a/link/sub", create=True),
            lambda: r.listdir("a/link"),
            lambda: r.create("a/link/new.txt"),
            lambda: r.delete("a/link/keep.txt"),
            lambda: r.makedirs("a/link/x/y"),
        ):
            with pytest.raises(NotBeneath) as caught:
                action()
            # Then it is refused naming the folder that is a symlink, never where it points
            assert "a/link is a symlink" in str(caught.value) and str(outside) not in str(caught.value)
        with pytest.raises(NotBeneath, match="a/file on its way is not a folder"):
            r.opendir("a/file/x")
    # And nothing outside changed, nothing was made there
    assert tree(outside) == {"keep.txt": b"outside"}


def test_a_root_with_a_symlink_on_its_path_is_refused(scene: tuple[Path, Path]) -> None:
    # Given a root reached through a symlinked parent
    root, outside = scene
    alias = root.parent / "alias"
    alias.symlink_to(root.parent, target_is_directory=True)
    # When it is opened by that path / Then it is refused; by its real path it opens
    with pytest.raises(NotBeneath, match="no longer a real folder"):
        rootfs.open_root(alias / "root")
    rootfs.open_root(root).close()
    with pytest.raises(ValueError, match="absolute"):
        rootfs.open_root("relative/root")


@pytest.mark.parametrize("rel", ["../outside/keep.txt", "a/../../outside", "/etc/passwd"])
def test_a_path_leaving_the_root_is_refused(scene: tuple[Path, Path], rel: str) -> None:
    root, _ = scene
    with rootfs.open_root(root) as r, pytest.raises(ValueError, match="not a path beneath a root"):
        r.delete(rel)


def test_folders_are_made_beneath_the_root_and_names_are_acted_on_by_descriptor(
    scene: tuple[Path, Path],
) -> None:
    # Given a root
    root, _ = scene
    with rootfs.open_root(root) as r:
        # When folders are made, a file created, linked, renamed without replacing, listed, removed
        with r.opendir("x/y", create=True) as folder:
            fd = folder.create("a.txt")
            os.write(fd, b"data")
            os.close(fd)
            rootfs.link(folder, "a.txt", r, "b.txt")
            with pytest.raises(FileExistsError):
                rootfs.rename_noreplace(folder, "a.txt", r, "b.txt")
            rootfs.rename_noreplace(folder, "a.txt", folder, "c.txt")
            assert sorted(folder.listdir()) == ["c.txt"] and r.is_file("x/y/c.txt")
        # Then each landed where it was named, beneath the root
        assert tree(root) == {"b.txt": b"data", "x": "dir", "x/y": "dir", "x/y/c.txt": b"data"}
        r.delete("b.txt")
        r.delete("x/y/c.txt")
        r.remove_folder("x/y")
        assert r.lstat("x/y") is None and r.listdir("x") == []


def test_an_open_file_gets_a_name_from_its_descriptor(scene: tuple[Path, Path]) -> None:
    # Given a file opened (it has a second name, as a photo with a staged link has), then its name
    # swapped for a symlink to an outside file
    root, outside = scene
    (root / "p.jpg").write_bytes(b"photo")
    os.link(root / "p.jpg", root / "second.jpg")
    fd = os.open(root / "p.jpg", os.O_RDONLY)
    try:
        (root / "p.jpg").unlink()
        (root / "p.jpg").symlink_to(outside / "keep.txt")
        # When the open file is linked to a new name
        with rootfs.open_root(root) as r:
            rootfs.link_open_file(fd, r, "staged")
    finally:
        os.close(fd)
    # Then the new name is the file that was open, not what the symlink points to
    assert (root / "staged").read_bytes() == b"photo" and not (root / "staged").is_symlink()


def test_roots_locate_a_path_beneath_the_deepest_and_refuse_one_beneath_none(
    scene: tuple[Path, Path],
) -> None:
    root, outside = scene
    (root / "sub").mkdir()
    fs = Roots([root, root / "sub"])
    assert fs.locate(root / "sub" / "a.jpg") == (root / "sub", "a.jpg")
    assert fs.locate(root / "b.jpg") == (root, "b.jpg")
    with pytest.raises(OutsideRoot, match="outside the job's roots"):
        fs.locate(outside / "keep.txt")
    with pytest.raises(OutsideRoot):
        fs.delete(outside / "keep.txt")
    assert tree(outside) == {"keep.txt": b"outside"}


# -- the safe-file protocol on it ----------------------------------------------------------------
def test_a_destination_folder_swapped_for_a_symlink_before_the_apply_gets_nothing(
    scene: tuple[Path, Path],
) -> None:
    # Given a staged edit, a staged copy and a photo to move, each planned into dest/, which is then
    # swapped for a symlink to an outside folder (holding a file of the target's name)
    root, outside = scene
    fs = Roots([root])
    dest = root / "dest"
    dest.mkdir()
    (dest / "edit.jpg").write_bytes(b"original")
    staged_edit = fileops.stage_bytes(dest / "edit.jpg", "t1", b"edited", within=fs)
    staged_copy = fileops.stage_bytes(dest / "new.jpg", "t1", b"copy", within=fs)
    photo = root / "IMG_0001.jpg"
    photo.write_bytes(b"photo")
    swap_for_symlink(dest, outside)
    (outside / "edit.jpg").write_bytes(b"outside edit.jpg")
    before = tree(outside)
    # When each is applied
    for apply in (
        lambda: fileops.replace_atomic(staged_edit, dest / "edit.jpg", within=fs),
        lambda: fileops.publish_no_clobber(staged_copy, dest / "new.jpg", within=fs),
        lambda: fileops.move_no_clobber(photo, dest / "sub" / "IMG_0001.jpg", within=fs),
        lambda: fileops.stage_bytes(dest / "other.jpg", "t2", b"x", within=fs),
    ):
        # Then each is refused, naming the folder that is a symlink
        with pytest.raises(NotBeneath, match="dest is a symlink"):
            apply()
    # And nothing outside was written, replaced or made; the photo stayed where it was
    assert tree(outside) == before
    assert photo.read_bytes() == b"photo"


def test_a_folder_swapped_between_opening_it_and_the_link_gets_nothing_outside(
    scene: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a move whose folders are opened, after which (the narrowest race) the target's folder
    # is renamed away and a symlink to an outside folder put in its place
    root, outside = scene
    fs = Roots([root])
    (root / "dest").mkdir()
    photo = root / "IMG_0001.jpg"
    photo.write_bytes(b"photo")
    opened = Roots.folders

    @contextlib.contextmanager
    def then_swap(self: Roots, *paths: Path, create: bool = False) -> Iterator[list[tuple[rootfs.Root, str]]]:
        with opened(self, *paths, create=create) as found:
            if (root / "dest").is_dir() and not (root / "dest").is_symlink():
                swap_for_symlink(root / "dest", outside)
            yield found

    monkeypatch.setattr(Roots, "folders", then_swap)
    # When the move links and drops the old name
    fileops.move_no_clobber(photo, root / "dest" / "IMG_0001.jpg", within=fs)
    # Then it acted on the folder it had opened: the photo is inside (in the folder renamed away),
    # and nothing reached the outside folder
    assert tree(outside) == {"keep.txt": b"outside"}
    assert (root / "dest.moved" / "IMG_0001.jpg").read_bytes() == b"photo" and not photo.exists()


def test_a_symlink_planted_at_the_staged_name_is_replaced_never_written_through(
    scene: tuple[Path, Path],
) -> None:
    root, outside = scene
    fs = Roots([root])
    fileops.staged_path(root / "a.jpg", "t1").symlink_to(outside / "keep.txt")
    staged = fileops.stage_bytes(root / "a.jpg", "t1", b"new", within=fs)
    assert staged.read_bytes() == b"new" and not staged.is_symlink()
    assert tree(outside) == {"keep.txt": b"outside"}


def test_recovery_of_an_effect_whose_folder_is_a_symlink_now_is_a_conflict_touching_nothing(
    scene: tuple[Path, Path],
) -> None:
    # Given a recorded edit staged in album/, then album/ swapped for a symlink to an outside folder
    # holding a file of the photo's name
    root, outside = scene
    fs = Roots([root])
    album = root / "album"
    album.mkdir()
    (album / "p.jpg").write_bytes(b"original")
    staged = fileops.stage_bytes(album / "p.jpg", "t1", b"edited", within=fs)
    swap_for_symlink(album, outside)
    (outside / "p.jpg").write_bytes(b"original")
    effect = recovery.Effect("replace", str(staged), str(album / "p.jpg"), None, None, None)
    # When recovery settles it (may apply)
    verdict = recovery.settle_on_disk(effect, may_apply=True, tag="r1", within=fs)
    # Then nothing is applied and the outside file is untouched
    assert verdict.state == recovery.CONFLICT and not verdict.applied_now
    assert (outside / "p.jpg").read_bytes() == b"original"


def test_the_sweep_of_staged_files_never_follows_a_symlinked_folder(scene: tuple[Path, Path]) -> None:
    # Given an old staged-looking file outside, reachable from the root through a symlinked folder
    root, outside = scene
    (outside / ".x.jpg.pj-i1-t1.tmp").write_bytes(b"outside")
    os.utime(outside / ".x.jpg.pj-i1-t1.tmp", (1, 1))
    (root / "link").symlink_to(outside, target_is_directory=True)
    (root / ".y.jpg.pj-i1-t1.tmp").write_bytes(b"stray")
    os.utime(root / ".y.jpg.pj-i1-t1.tmp", (1, 1))
    # When the root is swept / Then only the stray inside goes
    assert fileops.sweep_stray_temps(root, 60) == [root / ".y.jpg.pj-i1-t1.tmp"]
    assert (outside / ".x.jpg.pj-i1-t1.tmp").exists()


# -- the history store: a real folder or nothing -------------------------------------------------
def test_a_history_store_that_is_a_symlink_keeps_nothing_anywhere(scene: tuple[Path, Path]) -> None:
    # Given a photo whose root's .photojobs-history is a symlink to an outside folder
    root, outside = scene
    photo = root / "p.jpg"
    photo.write_bytes(b"original")
    sha = fileops.sha256_file(photo)
    (root / history.FOLDER).symlink_to(outside, target_is_directory=True)
    # When its original is kept
    with pytest.raises(history.StoreRefused, match="symlink or not a folder") as caught:
        history.keep(photo, sha, within=Roots([root]))
    # Then it is refused naming the store, and nothing was linked or made outside
    assert caught.value.path == str(root / history.FOLDER)
    assert tree(outside) == {"keep.txt": b"outside"}
    # And a store that is a file is refused the same way
    (root / history.FOLDER).unlink()
    (root / history.FOLDER).write_bytes(b"not a folder")
    with pytest.raises(history.StoreRefused):
        history.keep(photo, sha, within=Roots([root]))


def test_prune_through_a_symlinked_store_deletes_nothing_it_points_to(
    scene: tuple[Path, Path], caplog: pytest.LogCaptureFixture
) -> None:
    # Given an upload folder whose .photojobs-history is a symlink to a folder holding old files in
    # content-addressed places (and other names)
    root, outside = scene
    sha = "ab" + "0" * 62
    (outside / "ab").mkdir()
    (outside / "ab" / sha).write_bytes(b"victim")
    (outside / "ab" / "id_rsa").write_bytes(b"secret")
    os.utime(outside / "ab" / sha, (1, 1))
    (root / history.FOLDER).symlink_to(outside, target_is_directory=True)
    before = tree(outside)
    # When prune removes the recorded kept path there and sweeps the store for unreferenced files
    removed = history.prune([str(root / history.FOLDER / "ab" / sha)], keep_paths=set())
    swept = history.sweep_unreferenced(root / history.FOLDER, set(), 0)
    # Then nothing is removed, and the store is named in a warning
    assert removed == [] and swept == []
    assert tree(outside) == before
    assert f"skipped the history store {root / history.FOLDER}: it is a symlink" in caplog.text


def test_prune_removes_only_content_addressed_regular_files_in_real_folders(scene: tuple[Path, Path]) -> None:
    # Given a real store with a kept file, a look-alike, a symlink at a kept name and a
    # symlinked sub-folder
    root, outside = scene
    sha = "cd" + "1" * 62
    store = root / history.FOLDER
    (store / "cd").mkdir(parents=True)
    (store / "cd" / sha).write_bytes(b"kept")
    (store / "cd" / "notes.txt").write_bytes(b"mine")
    link = "cd" + "2" * 62
    (store / "cd" / link).symlink_to(outside / "keep.txt")
    (store / "ef").symlink_to(outside, target_is_directory=True)
    # When everything older than 0 s is swept and named paths pruned
    history.prune([str(store / "cd" / link), str(store / "ef" / ("ef" + "3" * 62))], keep_paths=set())
    swept = history.sweep_unreferenced(store, set(), -1)
    # Then only the content-addressed regular file went; the symlink, the other name and
    # everything outside stay
    assert swept == [str(store / "cd" / sha)]
    assert sorted(p.name for p in (store / "cd").iterdir()) == [link, "notes.txt"]
    assert tree(outside) == {"keep.txt": b"outside"}


def test_renameat2_without_support_says_so(monkeypatch: pytest.MonkeyPatch, scene: tuple[Path, Path]) -> None:
    # Given a libc whose renameat2 answers EINVAL (a filesystem that cannot do RENAME_NOREPLACE)
    root, _ = scene
    (root / "a").write_bytes(b"a")

    class NoRenameat2:
        def __getattr__(self, name: str) -> object:
            raise AttributeError(name)

    with rootfs.open_root(root) as r, pytest.raises(OSError) as caught:
        monkeypatch.setattr(rootfs, "_libc", NoRenameat2())
        rootfs.rename_noreplace(r, "a", r, "b")
    assert caught.value.errno == errno.ENOSYS


def test_nothing_is_at_a_path_whose_root_is_not_made_yet(tmp_path: Path) -> None:
    # Given an upload folder a job will make, not there yet / Then a name beneath it holds nothing
    fs = Roots([tmp_path / "uploads"])
    assert fs.lstat(tmp_path / "uploads" / "ab" / "x.jpg") is None
    assert fileops.content_sha256(tmp_path / "uploads" / "x.jpg", within=fs) is None
