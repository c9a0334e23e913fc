"""The history store: displaced originals kept for undo, and the tags an edit changes.

When an effect replaces a file (a metadata edit, or an undo restoring one), the file it displaces is
kept first, content-addressed, in a hidden folder beside the photo's root
(``ROOT/.photojobs-history/ab/abcdef…``): a hard link to the inode the atomic replace will take off
the photo's name, so keeping it costs no copy (a copy only where the store is on another filesystem
or the filesystem has no hard links). The folder is inside the configured roots, on the photos'
filesystem, hidden (a folder scan never takes it for photos), and pruned by ``photojobs prune``
(``PHOTOJOBS_HISTORY_KEEP``). A kept file is used only after its content is verified again.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from . import fileops
from .errors import PhotoError

FOLDER = ".photojobs-history"
_NO_LINK = {errno.EXDEV, errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}
# Groups (exiftool family 0) that describe the file or exiftool itself, not what an edit wrote.
_NOT_METADATA = {"File", "ExifTool", "Composite", "System", "SourceFile"}


def store_for(root: str | os.PathLike[str]) -> Path:
    """The history store of a photo root."""
    return Path(root) / FOLDER


def blob_path(store: Path, sha256: str) -> Path:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ValueError(f"not a SHA-256: {sha256!r}")
    return store / sha256[:2] / sha256


def keep(path: str | os.PathLike[str], sha256: str, store: Path) -> Path | None:
    """Keep the file at ``path`` (content ``sha256``) in ``store``: a hard link, or a copy across
    filesystems. Returns the kept file, or None when what is at ``path`` is not ``sha256`` (it changed
    meanwhile; nothing wrong is ever kept under a content address). An existing blob is reused."""
    blob = blob_path(store, sha256)
    if blob.is_file() and not blob.is_symlink():
        return blob
    blob.parent.mkdir(parents=True, exist_ok=True)
    tmp = fileops.staged_path(blob, f"keep{os.getpid()}")
    tmp.unlink(missing_ok=True)
    try:
        os.link(path, tmp, follow_symlinks=False)
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
        tmp = fileops.stage_copy(path, blob, f"keep{os.getpid()}")
    try:
        if fileops.sha256_file(tmp, nofollow=True) != sha256:
            return None
        os.replace(tmp, blob)
    finally:
        tmp.unlink(missing_ok=True)
    fileops.fsync_dir(blob.parent)
    return blob


def kept_file(kept: str | None, sha256: str | None) -> Path:
    """The kept original, verified to hold ``sha256``; ``PhotoError`` naming why it cannot be used."""
    if not kept or not sha256:
        raise PhotoError(
            None, "the original was not kept (pruned after PHOTOJOBS_HISTORY_KEEP, or never kept)"
        )
    path = Path(kept)
    if not path.is_file() or path.is_symlink():
        raise PhotoError(path, "the kept original is gone (pruned?); not restored")
    if fileops.sha256_file(path, nofollow=True) != sha256:
        raise PhotoError(path, f"the kept original no longer holds sha256 {sha256}; not restored")
    return path


def tag_changes(before: str | os.PathLike[str] | None, after: str | os.PathLike[str]) -> dict[str, list[Any]]:
    """``{TAG: [BEFORE, AFTER]}`` for every metadata tag (exiftool's ``GROUP:Name``, family 0) whose
    value differs between the two files (``before`` None: a new file); None for a tag one of them
    lacks. Binary values are left out."""
    from . import exiftool

    files = [os.path.abspath(f) for f in (before, after) if f is not None]
    # -fast: metadata up to the image data (not a trailer after it); what an edit changes is there
    out = exiftool.ExifTool.shared().execute("-j", "-G", "-a", "-fast", *files, retry_if_died=True)
    try:
        found = json.loads(out)
        a, b = ({}, found[0]) if before is None else (found[0], found[1])
    except (ValueError, IndexError, KeyError):
        return {}
    changes: dict[str, list[Any]] = {}
    for tag in sorted(set(a) | set(b)):
        if tag.split(":", 1)[0] in _NOT_METADATA:
            continue
        va, vb = a.get(tag), b.get(tag)
        if va == vb or any(isinstance(v, str) and v.startswith("(Binary data") for v in (va, vb)):
            continue
        changes[tag] = [va, vb]
    return changes


def tag_changes_or_none(before: Path | None, after: Path) -> dict[str, list[Any]] | None:
    """:func:`tag_changes`, or None when exiftool cannot tell (history then shows no tags)."""
    try:
        return tag_changes(before, after)
    except (PhotoError, OSError):
        return None


def prune(paths: Iterable[str], *, keep_paths: set[str]) -> list[str]:
    """Remove the kept files ``paths`` (never one still in ``keep_paths``); the removed ones."""
    removed = []
    for p in paths:
        if p in keep_paths or FOLDER not in Path(p).parts:
            continue
        try:
            os.unlink(p)
        except FileNotFoundError:
            pass
        removed.append(p)
    return removed


def sweep_unreferenced(store: Path, referenced: set[str], older_than: float) -> list[str]:
    """Remove kept files in ``store`` no effect names (kept for an edit that never landed), older than
    ``older_than`` seconds (by ctime: when the link was made)."""
    removed: list[str] = []
    if not store.is_dir():
        return removed
    now = time.time()
    for sub in store.iterdir():
        if not sub.is_dir() or sub.is_symlink():
            continue
        for f in sub.iterdir():
            try:
                st = os.lstat(f)
            except FileNotFoundError:
                continue
            if str(f) in referenced or now - st.st_ctime <= older_than:
                continue
            f.unlink(missing_ok=True)
            removed.append(str(f))
    return removed
