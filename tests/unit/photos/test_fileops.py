"""Safe file operations: staging, atomic replace, no-clobber publish and move, sweeping — each beneath
its root (``photos.rootfs``)."""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

import pytest

from photos import fileops, rootfs
from photos.errors import InvalidParameter, PhotoError
from photos.fileops import (
    is_staged_name,
    move_no_clobber,
    publish_no_clobber,
    replace_atomic,
    sha256_file,
    stage_bytes,
    stage_copy,
    stage_with,
    staged_path,
    sweep_stray_temps,
)


def _cross_device_link(real_link=os.link):
    """A linkat that fails with EXDEV between different folders (as across mounts)."""

    def link(src, dst, *, src_dir_fd=None, dst_dir_fd=None, follow_symlinks=True):
        if os.fstat(src_dir_fd).st_ino != os.fstat(dst_dir_fd).st_ino:
            raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))
        return real_link(
            src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd, follow_symlinks=follow_symlinks
        )

    return link


def _no_hardlinks(src, dst, **_):
    """A linkat on a filesystem without hard links (exFAT, some network mounts)."""
    raise OSError(errno.EPERM, "Operation not permitted", str(src), None, str(dst))


@pytest.fixture
def fs(tmp_path: Path) -> rootfs.Roots:
    """The test's folder as the one root every operation acts beneath."""
    return rootfs.Roots([tmp_path])


# -- hashing and names ---------------------------------------------------------------------------
def test_sha256_file_streams_a_multi_chunk_file(tmp_path: Path) -> None:
    # Given a file larger than one 1 MiB chunk
    data = os.urandom(fileops.CHUNK * 2 + 123)
    path = tmp_path / "big.bin"
    path.write_bytes(data)
    # When it is hashed
    digest = sha256_file(path)
    # Then the digest is the SHA-256 of the whole content
    assert digest == hashlib.sha256(data).hexdigest()


def test_staged_path_is_a_hidden_temp_name_next_to_the_target(tmp_path: Path) -> None:
    # Given a target with spaces and non-ASCII characters
    target = tmp_path / "sub" / "Été à Paris 03.jpg"
    # When its staged path is computed
    staged = staged_path(target, "item12-t5")
    # Then it sits in the same directory with the documented name, recognised as staged
    assert staged == tmp_path / "sub" / ".Été à Paris 03.jpg.pj-item12-t5.tmp"
    assert is_staged_name(staged.name)


@pytest.mark.parametrize(
    "name, expected",
    [
        (".a.jpg.pj-item1-t1.tmp", True),
        (".x.pj-move.tmp", True),
        ("a.jpg", False),
        (".a.jpg.tmp", False),
        ("a.jpg.pj-item1.tmp", False),
        (".a.jpg.pj-item1.tmp.jpg", False),
    ],
)
def test_is_staged_name_recognises_only_staged_names(name: str, expected: bool) -> None:
    # Given a file name / When it is classified / Then only staged names match
    assert is_staged_name(name) is expected


@pytest.mark.parametrize("tag", ["", "a/b", "..", "x" * 65, "sp ace", "nul\x00"])
def test_staged_path_refuses_unsafe_tags(tmp_path: Path, tag: str) -> None:
    # Given a tag that could escape the directory or is malformed / When staged / Then refused
    with pytest.raises(InvalidParameter):
        staged_path(tmp_path / "a.jpg", tag)


def test_staged_path_shortens_names_that_would_be_too_long(tmp_path: Path) -> None:
    # Given a target whose name is at the 255-byte limit
    target = tmp_path / ("é" * 120 + ".jpg")
    # When its staged path is computed (twice)
    staged = staged_path(target, "item1-t1")
    # Then the name fits, is still recognised as staged, and is deterministic
    assert len(os.fsencode(staged.name)) <= 255
    assert is_staged_name(staged.name)
    assert staged == staged_path(target, "item1-t1")
    staged.write_bytes(b"ok")  # the filesystem accepts it
    assert staged.read_bytes() == b"ok"


# -- staging -------------------------------------------------------------------------------------
def test_stage_bytes_creates_parents_and_writes_the_content(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a target in directories that do not exist yet
    target = tmp_path / "a" / "b" / "photo.jpg"
    # When bytes are staged for it
    staged = stage_bytes(target, "t1", b"hello", within=fs)
    # Then the staged file holds them, next to the target, and the target does not exist yet
    assert staged.read_bytes() == b"hello"
    assert staged.parent == target.parent
    assert not target.exists()


def test_stage_bytes_overwrites_a_stale_staged_file_of_the_same_tag(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a staged file left by a crashed attempt with the same tag
    target = tmp_path / "photo.jpg"
    staged_path(target, "t1").write_bytes(b"stale and longer")
    # When the attempt stages again
    staged = stage_bytes(target, "t1", b"new", within=fs)
    # Then the staged file has exactly the new content
    assert staged.read_bytes() == b"new"


def test_stage_bytes_never_writes_through_a_symlink_at_the_staged_name(
    tmp_path: Path, fs: rootfs.Roots
) -> None:
    # Given a symlink planted at the staged name, pointing at a file elsewhere
    outside = tmp_path / "outside.txt"
    outside.write_bytes(b"do not touch")
    target = tmp_path / "album" / "photo.jpg"
    target.parent.mkdir()
    staged_path(target, "t1").symlink_to(outside)
    # When staging
    staged = stage_bytes(target, "t1", b"photo bytes", within=fs)
    # Then a regular staged file is written and the symlink's target is untouched
    assert not staged.is_symlink() and staged.read_bytes() == b"photo bytes"
    assert outside.read_bytes() == b"do not touch"


def test_stage_copy_copies_content_and_timestamps(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a source file with an old modification time
    src = tmp_path / "src.jpg"
    src.write_bytes(b"x" * 5000)
    os.utime(src, (1_500_000_000, 1_500_000_000))
    # When it is staged as a copy for another target
    staged = stage_copy(src, tmp_path / "out" / "dst.jpg", "t2", within=fs)
    # Then content and mtime are copied and the source is untouched
    assert staged.read_bytes() == b"x" * 5000
    assert staged.stat().st_mtime == 1_500_000_000
    assert src.read_bytes() == b"x" * 5000


def test_stage_with_removes_the_staged_file_when_the_writer_fails(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a writer that fails half way
    def writer(fh):
        fh.write(b"partial")
        raise RuntimeError("encoder exploded")

    target = tmp_path / "photo.jpg"
    # When staging with it
    with pytest.raises(RuntimeError, match="encoder exploded"):
        stage_with(target, "t3", writer, within=fs)
    # Then no staged file is left behind
    assert not staged_path(target, "t3").exists()
    assert list(tmp_path.iterdir()) == []


# -- replace_atomic ------------------------------------------------------------------------------
def test_replace_atomic_overwrites_the_target(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a target and a staged edit of it
    target = tmp_path / "photo.jpg"
    target.write_bytes(b"old")
    staged = stage_bytes(target, "t1", b"new", within=fs)
    # When the staged file replaces the target
    replace_atomic(staged, target, within=fs)
    # Then the target has the new content and the staged name is gone
    assert target.read_bytes() == b"new"
    assert not staged.exists()


def test_replace_atomic_after_the_staged_file_is_gone_raises_and_changes_nothing(
    tmp_path: Path, fs: rootfs.Roots
) -> None:
    # Given a staged edit that another attempt already applied (so the staged file is gone)
    target = tmp_path / "photo.jpg"
    target.write_bytes(b"old")
    staged = stage_bytes(target, "t1", b"new", within=fs)
    replace_atomic(staged, target, within=fs)
    target.write_bytes(b"edited later by someone else")
    # When a zombie attempt applies it late
    with pytest.raises(FileNotFoundError, match="staged file is gone"):
        replace_atomic(staged, target, within=fs)
    # Then the target is left as it was
    assert target.read_bytes() == b"edited later by someone else"


# -- publish_no_clobber --------------------------------------------------------------------------
def test_publish_no_clobber_publishes_a_new_name(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a staged file for a target that does not exist
    target = tmp_path / "new.jpg"
    staged = stage_bytes(target, "t1", b"content", within=fs)
    # When it is published
    publish_no_clobber(staged, target, within=fs)
    # Then the target has the content and the staged name is gone
    assert target.read_bytes() == b"content"
    assert not staged.exists()


def test_publish_no_clobber_refuses_an_existing_target(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given an existing target and a staged file for the same name
    target = tmp_path / "taken.jpg"
    target.write_bytes(b"precious")
    staged = stage_bytes(target, "t1", b"other", within=fs)
    # When publishing
    with pytest.raises(FileExistsError):
        publish_no_clobber(staged, target, within=fs)
    # Then neither file changed
    assert target.read_bytes() == b"precious"
    assert staged.read_bytes() == b"other"


def test_publish_no_clobber_completes_a_publish_interrupted_after_the_link(
    tmp_path: Path, fs: rootfs.Roots
) -> None:
    # Given an attempt that linked the staged file to the target, then died before the unlink
    target = tmp_path / "new.jpg"
    staged = stage_bytes(target, "t1", b"content", within=fs)
    os.link(staged, target)
    # When the publish is retried
    publish_no_clobber(staged, target, within=fs)
    # Then it completes: the target stays, the staged name is removed
    assert target.read_bytes() == b"content"
    assert not staged.exists()


def test_publish_no_clobber_without_hard_links_uses_rename_noreplace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs: rootfs.Roots
) -> None:
    # Given a filesystem without hard links
    monkeypatch.setattr(rootfs, "_link", _no_hardlinks)
    target = tmp_path / "new.jpg"
    staged = stage_bytes(target, "t1", b"content", within=fs)
    taken = tmp_path / "taken.jpg"
    taken.write_bytes(b"precious")
    staged2 = stage_bytes(taken, "t2", b"other", within=fs)
    # When publishing to a free name and to a taken one
    publish_no_clobber(staged, target, within=fs)
    with pytest.raises(FileExistsError):
        publish_no_clobber(staged2, taken, within=fs)
    # Then the free name is published and the taken one is untouched
    assert target.read_bytes() == b"content"
    assert not staged.exists()
    assert taken.read_bytes() == b"precious"


# -- move_no_clobber -----------------------------------------------------------------------------
def test_move_no_clobber_moves_within_a_filesystem(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a source file
    src = tmp_path / "in" / "a b é.jpg"
    src.parent.mkdir()
    src.write_bytes(b"photo")
    target = tmp_path / "out" / "2021" / "a.jpg"
    # When it is moved
    move_no_clobber(src, target, within=fs)
    # Then the target has the content, the source is gone, no temp is left
    assert target.read_bytes() == b"photo"
    assert not src.exists()
    assert [p.name for p in target.parent.iterdir()] == ["a.jpg"]


def test_move_no_clobber_refuses_an_existing_target(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given a source and an existing target
    src = tmp_path / "a.jpg"
    src.write_bytes(b"mine")
    target = tmp_path / "b.jpg"
    target.write_bytes(b"theirs")
    # When moving onto it
    with pytest.raises(FileExistsError):
        move_no_clobber(src, target, within=fs)
    # Then both files are unchanged
    assert src.read_bytes() == b"mine"
    assert target.read_bytes() == b"theirs"


def test_move_no_clobber_across_filesystems_copies_verifies_and_unlinks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs: rootfs.Roots
) -> None:
    # Given a link that fails with EXDEV between directories (as between two mounts)
    monkeypatch.setattr(rootfs, "_link", _cross_device_link())
    data = os.urandom(fileops.CHUNK + 77)
    src = tmp_path / "card" / "IMG_0001.jpg"
    src.parent.mkdir()
    src.write_bytes(data)
    target = tmp_path / "library" / "IMG_0001.jpg"
    # When it is moved with the expected hash
    move_no_clobber(src, target, hashlib.sha256(data).hexdigest(), within=fs)
    # Then the copy arrived intact, the source is gone and no staged temp is left
    assert target.read_bytes() == data
    assert not src.exists()
    assert [p.name for p in target.parent.iterdir()] == ["IMG_0001.jpg"]


def test_move_across_filesystems_with_a_wrong_hash_keeps_the_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs: rootfs.Roots
) -> None:
    # Given a cross-device move whose expected hash does not match the source
    monkeypatch.setattr(rootfs, "_link", _cross_device_link())
    src = tmp_path / "card" / "a.jpg"
    src.parent.mkdir()
    src.write_bytes(b"changed since it was analysed")
    target = tmp_path / "library" / "a.jpg"
    # When it is moved
    with pytest.raises(PhotoError, match="did not verify"):
        move_no_clobber(src, target, "0" * 64, within=fs)
    # Then the source is kept, the target was not created and the staged copy was removed
    assert src.read_bytes() == b"changed since it was analysed"
    assert not target.exists()
    assert list(target.parent.iterdir()) == []


def test_move_across_filesystems_refuses_an_existing_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fs: rootfs.Roots
) -> None:
    # Given a cross-device move onto an existing file
    monkeypatch.setattr(rootfs, "_link", _cross_device_link())
    src = tmp_path / "card" / "a.jpg"
    src.parent.mkdir()
    src.write_bytes(b"mine")
    target = tmp_path / "library" / "a.jpg"
    target.parent.mkdir()
    target.write_bytes(b"theirs")
    # When moving
    with pytest.raises(FileExistsError):
        move_no_clobber(src, target, within=fs)
    # Then nothing changed and nothing was staged
    assert src.read_bytes() == b"mine"
    assert target.read_bytes() == b"theirs"
    assert [p.name for p in target.parent.iterdir()] == ["a.jpg"]


def test_move_no_clobber_of_a_missing_source_raises(tmp_path: Path, fs: rootfs.Roots) -> None:
    # Given no source / When moved / Then FileNotFoundError and no target
    with pytest.raises(FileNotFoundError):
        move_no_clobber(tmp_path / "missing.jpg", tmp_path / "out.jpg", within=fs)
    assert not (tmp_path / "out.jpg").exists()


# -- sweep_stray_temps ---------------------------------------------------------------------------
def test_sweep_removes_only_old_unclaimed_staged_files(tmp_path: Path) -> None:
    # Given old and fresh staged files, a live one, a photo and a look-alike, in nested folders
    now = 2_000_000_000.0
    old = now - 3600
    (tmp_path / "a" / "b").mkdir(parents=True)
    stray = tmp_path / "a" / ".x.jpg.pj-item1-t1.tmp"
    nested = tmp_path / "a" / "b" / ".y.jpg.pj-item2-t1.tmp"
    fresh = tmp_path / ".z.jpg.pj-item3-t1.tmp"
    live = tmp_path / ".w.jpg.pj-item4-t2.tmp"
    photo = tmp_path / "a" / "photo.jpg"
    lookalike = tmp_path / "notes.pj-1.tmp"
    for p in (stray, nested, fresh, live, photo, lookalike):
        p.write_bytes(b"data")
        os.utime(p, (old, old))
    os.utime(fresh, (now - 10, now - 10))
    # When swept with a 10-minute threshold, the worker claiming item4
    removed = sweep_stray_temps(tmp_path, 600, lambda p: "item4" in p.name, now=now)
    # Then only the old, unclaimed staged files are removed (and reported, sorted)
    assert removed == sorted([stray, nested])
    assert not stray.exists() and not nested.exists()
    assert fresh.exists() and live.exists() and photo.exists() and lookalike.exists()


def test_sweep_of_a_clean_tree_removes_nothing(tmp_path: Path) -> None:
    # Given a tree without staged files / When swept / Then nothing is removed
    (tmp_path / "a.jpg").write_bytes(b"x")
    assert sweep_stray_temps(tmp_path, 0) == []
    assert (tmp_path / "a.jpg").exists()
