"""The history store (``photos.history``): displaced originals kept as hard links (a copy only
across filesystems), never kept under a wrong content address, verified before use; tag changes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
from PIL import Image

from photos import history, rootfs
from photos.errors import PhotoError
from photos.exiftool import ExifTool
from photos.fileops import sha256_file
from photos.rootfs import Roots
from tests.support import IN_CI


def _photo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (32, 24), "teal").save(path, "JPEG")
    return path


def test_a_displaced_original_is_kept_as_a_hard_link_costing_no_copy(tmp_path: Path) -> None:
    # Given a photo about to be replaced by an edit
    photo = _photo(tmp_path / "photos" / "a.jpg")
    sha = sha256_file(photo)
    store = history.store_for(tmp_path / "photos")
    fs = Roots([tmp_path / "photos"])
    # When it is kept, then replaced
    kept = history.keep(photo, sha, within=fs)
    assert kept is not None and kept.stat().st_ino == photo.stat().st_ino
    staged = tmp_path / "photos" / ".a.jpg.pj-x.tmp"
    staged.write_bytes(b"edited")
    os.replace(staged, photo)
    # Then the kept file is the displaced inode itself (a link made before the replace), intact
    assert kept is not None and kept == store / sha[:2] / sha
    assert kept.stat().st_nlink == 1 and history.kept_file(str(kept), sha, within=fs) == kept
    assert sha256_file(kept) == sha
    # and keeping the same content again reuses it
    assert history.keep(kept, sha, within=fs) == kept


def test_across_filesystems_the_original_is_copied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    photo = _photo(tmp_path / "photos" / "a.jpg")
    sha = sha256_file(photo)

    def no_link(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EXDEV, "cross-device link")

    monkeypatch.setattr(rootfs, "_link", no_link)
    kept = history.keep(photo, sha, within=Roots([tmp_path / "photos"]))
    assert kept is not None and sha256_file(kept) == sha
    assert not os.path.samefile(kept, photo)


def test_a_file_that_is_not_the_planned_content_is_never_kept(tmp_path: Path) -> None:
    photo = _photo(tmp_path / "photos" / "a.jpg")
    wrong = "0" * 64
    store = history.store_for(tmp_path / "photos")
    assert history.keep(photo, wrong, within=Roots([tmp_path / "photos"])) is None
    assert not (store / wrong[:2] / wrong).exists()
    assert [p for p in store.rglob("*") if p.is_file()] == []  # no staged link left behind


def test_a_kept_original_is_verified_before_use(tmp_path: Path) -> None:
    photo = _photo(tmp_path / "photos" / "a.jpg")
    sha = sha256_file(photo)
    fs = Roots([tmp_path / "photos"])
    kept = history.keep(photo, sha, within=fs)
    assert kept is not None
    with pytest.raises(PhotoError, match="not kept"):
        history.kept_file(None, sha, within=fs)
    with pytest.raises(PhotoError, match="no longer holds"):
        kept.write_bytes(b"tampered")
        history.kept_file(str(kept), sha, within=fs)
    kept.unlink()
    with pytest.raises(PhotoError, match="is gone"):
        history.kept_file(str(kept), sha, within=fs)
    with pytest.raises(ValueError, match="not a SHA-256"):
        history.blob_path(tmp_path, "../../etc/passwd")


@pytest.mark.skipif(not ExifTool.shared().available() and not IN_CI, reason="exiftool is not installed")
def test_tag_changes_name_each_changed_tag_as_exiftool_does(tmp_path: Path) -> None:
    before = _photo(tmp_path / "a.jpg")
    after = tmp_path / "b.jpg"
    after.write_bytes(before.read_bytes())
    ExifTool.shared().execute(
        "-DateTimeOriginal=2024:01:02 03:04:05", "-Rating=4", "-overwrite_original", os.path.abspath(after)
    )
    changes = history.tag_changes(before, after)
    assert changes["EXIF:DateTimeOriginal"] == [None, "2024:01:02 03:04:05"]
    assert changes["XMP:Rating"] == [None, 4]
    assert not any(t.startswith(("File:", "SourceFile", "ExifTool:")) for t in changes)
    assert history.tag_changes(None, after)["XMP:Rating"] == [None, 4]


def test_prune_removes_only_kept_files(tmp_path: Path) -> None:
    photo = _photo(tmp_path / "photos" / "a.jpg")
    kept = history.keep(photo, sha256_file(photo), within=Roots([tmp_path / "photos"]))
    assert kept is not None
    assert history.prune([str(photo)], keep_paths=set()) == []  # not in a history store: never
    assert history.prune([str(kept)], keep_paths={str(kept)}) == []
    assert history.prune([str(kept)], keep_paths=set()) == [str(kept)]
    assert photo.exists() and not kept.exists()
