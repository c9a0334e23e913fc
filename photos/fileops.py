"""Safe file operations for the exactly-once protocol: stage, verify, publish.

Every output is first written to a *staged* temp file next to its target
(``.{name}.pj-{tag}.tmp``), flushed and fsynced, then published with one atomic step:

* :func:`replace_atomic` overwrites in place (``os.replace``), e.g. a metadata edit;
* :func:`publish_no_clobber` creates a new name and never overwrites (hard link, or
  ``renameat2(RENAME_NOREPLACE)`` on filesystems without hard links, such as exFAT);
* :func:`move_no_clobber` moves a file, copying and verifying across filesystems.

Every name is reached beneath its root (``within``, a :class:`photos.rootfs.Roots`) with no symlink
followed, and acted on through its folder's descriptor: a folder swapped for a symlink between a
check and the act writes, moves and removes nothing outside (``rootfs.NotBeneath``). Folders are
fsynced after each publish so the new name survives a power cut. :func:`sweep_stray_temps` removes
staged files left behind by crashed attempts.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from photos import rootfs
from photos.containment import open_inside
from photos.errors import InvalidParameter, OutsideRoot, PhotoError
from photos.rootfs import Root, Roots

CHUNK = 1024 * 1024
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_STAGED_RE = re.compile(r"^\..+\.pj-[A-Za-z0-9_.-]{1,64}\.tmp$", re.DOTALL)
_NAME_MAX = 255


def sha256_file(
    path: str | os.PathLike[str], *, roots: Sequence[str | os.PathLike[str]] | None = None
) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks. With ``roots`` (recorded already resolved) the
    file actually opened must lie inside them (:func:`photos.containment.open_inside`): a hash taken
    this way ties later work that verifies it (a staged copy, an S3 checksum) to a file inside.
    (A file beneath a job's roots that must not be followed at all: :func:`content_sha256`.)"""
    if roots is None:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    else:
        fh = os.fdopen(open_inside(path, roots, resolve_roots=False), "rb")
    with fh:
        return sha256_of(fh)


# -- staged names --------------------------------------------------------------------------------
def staged_path(target: str | os.PathLike[str], tag: str) -> Path:
    """The temp name next to ``target``: ``target.parent / f".{target.name}.pj-{tag}.tmp"``.

    ``tag`` identifies the attempt (e.g. ``"item12-t5"``): letters, digits, ``_ . -`` only.
    A name that would exceed 255 bytes is shortened deterministically (prefix + hash).
    """
    target = Path(target)
    if not _TAG_RE.match(tag):
        raise InvalidParameter(
            f"staging tag {tag!r} must be 1-64 letters, digits, '_', '.', '-', starting alphanumeric"
        )
    if not target.name:
        raise InvalidParameter(f"cannot stage {str(target)!r}: it has no file name")
    name = f".{target.name}.pj-{tag}.tmp"
    if len(os.fsencode(name)) > _NAME_MAX:
        digest = hashlib.sha256(os.fsencode(target.name)).hexdigest()[:12]
        suffix = f"~{digest}.pj-{tag}.tmp"
        room = _NAME_MAX - 1 - len(suffix.encode())
        stem = os.fsencode(target.name)[:room].decode("utf-8", "ignore")
        name = f".{stem}{suffix}"
    return target.parent / name


def is_staged_name(name: str) -> bool:
    """True for names made by :func:`staged_path` (``.{name}.pj-{tag}.tmp``)."""
    return bool(_STAGED_RE.match(name))


def stage_with(
    target: str | os.PathLike[str], tag: str, writer: Callable[[BinaryIO], None], *, within: Roots
) -> Path:
    """Create the staged file for ``target`` (and its parent folders, beneath their root), let
    ``writer`` fill it, flush + fsync it and its folder; return its path. A stale staged file of the
    same tag is removed first (never written through: the new one is ``O_EXCL | O_NOFOLLOW``); on
    error the staged file is removed and the error re-raised."""
    staged = staged_path(target, tag)
    write_new(staged, writer, within=within)
    return staged


def write_new(path: Path, writer: Callable[[BinaryIO], None], *, within: Roots) -> None:
    """Write a new file at ``path`` beneath its root (its missing folders made): whatever is at the
    name is removed first, never written through (``O_EXCL | O_NOFOLLOW``); ``writer`` fills it, it
    and its folder are fsynced; on error it is removed and the error re-raised."""
    with within.folder_of(path, create=True) as (folder, name):
        folder.delete(name, missing_ok=True)
        fd = folder.create(name)
        try:
            with os.fdopen(fd, "wb") as fh:
                writer(fh)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            folder.delete(name, missing_ok=True)
            raise
        folder.fsync()


def stage_bytes(target: str | os.PathLike[str], tag: str, data: bytes, *, within: Roots) -> Path:
    """Stage ``data`` as the future content of ``target``; return the staged path."""

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    return stage_with(target, tag, write, within=within)


def stage_copy(
    src: str | os.PathLike[str], target: str | os.PathLike[str], tag: str, *, within: Roots
) -> Path:
    """Stage a copy of ``src`` (content, permission bits and timestamps; read beneath its root, not
    followed) next to ``target``."""
    staged, _ = _stage_copy_hashed(Path(src), Path(target), tag, within)
    return staged


def _stage_copy_hashed(src: Path, target: Path, tag: str, within: Roots) -> tuple[Path, str]:
    """Copy ``src`` to a staged file next to ``target``; return it and the SHA-256 of what was read."""
    digest = hashlib.sha256()

    def write(fh: BinaryIO) -> None:
        with os.fdopen(within.open(src), "rb") as source:
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                fh.write(chunk)
            st = os.fstat(source.fileno())
        fh.flush()
        try:  # permission bits and times are a courtesy; the content is what must be right
            os.chmod(fh.fileno(), stat.S_IMODE(st.st_mode))
            os.utime(fh.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
        except OSError:
            pass

    return stage_with(target, tag, write, within=within), digest.hexdigest()


def content_sha256(path: str | os.PathLike[str], *, within: Roots) -> str | None:
    """SHA-256 of the regular file at ``path``, opened beneath its root (no symlink followed, on its
    way or at its name); None when there is none there (gone, a symlink, not a regular file).
    A path out of reach (outside the roots, a folder on its way a symlink) is ``OutsideRoot``."""
    try:
        fd = within.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return sha256_of(fh)


def sha256_of(fh: BinaryIO) -> str:
    """Hex SHA-256 of what is left to read of ``fh``, in 1 MiB chunks."""
    digest = hashlib.sha256()
    while chunk := fh.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()


# -- publishing ----------------------------------------------------------------------------------
def replace_atomic(staged: str | os.PathLike[str], target: str | os.PathLike[str], *, within: Roots) -> None:
    """Atomically put ``staged`` in place of ``target`` (overwriting it) and fsync the folder(s),
    both names resolved beneath their root (``rootfs.NotBeneath`` when a folder on the way is a
    symlink now: nothing replaced).

    Raises FileNotFoundError when ``staged`` no longer exists: the edit was already applied by
    another attempt (or swept), so a late attempt must not apply anything.
    """
    with within.folders(staged, target) as [(sf, sname), (tf, tname)]:
        try:
            rootfs.replace(sf, sname, tf, tname)
        except FileNotFoundError as exc:
            if sf.lstat(sname) is None:
                raise FileNotFoundError(
                    errno.ENOENT, "staged file is gone (already applied or swept)", str(staged)
                ) from exc
            raise
        _fsync_folders(sf, tf)


def publish_no_clobber(
    staged: str | os.PathLike[str], target: str | os.PathLike[str], *, within: Roots
) -> None:
    """Give ``staged`` the name ``target`` without ever overwriting an existing ``target``.

    ``linkat`` then unlink of the staged name (``renameat2(RENAME_NOREPLACE)`` where the
    filesystem has no hard links), beneath their roots; folders are fsynced. Raises FileExistsError
    if ``target`` exists, FileNotFoundError if ``staged`` is gone. If ``target`` already *is* the
    staged file (an earlier attempt linked it and crashed before unlinking) the publish is
    completed instead of failing.
    """
    with within.folders(staged, target) as [(sf, sname), (tf, tname)]:
        _rename_no_clobber(sf, sname, tf, tname)
        _fsync_folders(sf, tf)


def move_no_clobber(
    src: str | os.PathLike[str],
    target: str | os.PathLike[str],
    expected_sha256: str | None = None,
    *,
    tag: str = "move",
    within: Roots,
) -> None:
    """Move ``src`` to ``target``, never overwriting an existing ``target``; the target's missing
    folders are made beneath its root, and every folder is reached without following a symlink.

    Same filesystem: hard link + unlink (or ``renameat2(RENAME_NOREPLACE)``). Across filesystems
    (EXDEV): copy to a staged file next to ``target``, fsync, verify its SHA-256 against
    ``expected_sha256`` (or, if None, against the hash of what was read from ``src``), publish
    it with :func:`publish_no_clobber`, then unlink ``src``. Raises FileExistsError if
    ``target`` exists, FileNotFoundError if ``src`` is missing, and PhotoError if the copy does
    not verify (``src`` is then left untouched and the staged copy removed).
    """
    src, target = Path(src), Path(target)
    within.makedirs(target.parent)
    with within.folders(src, target) as [(sf, sname), (tf, tname)]:
        try:
            _rename_no_clobber(sf, sname, tf, tname)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
        else:
            _fsync_folders(sf, tf)
            return
        if tf.lstat(tname) is not None:
            raise FileExistsError(errno.EEXIST, "target already exists", str(target))
    _move_across_filesystems(src, target, expected_sha256, tag, within)


def _move_across_filesystems(
    src: Path, target: Path, expected_sha256: str | None, tag: str, within: Roots
) -> None:
    staged, read_sha = _stage_copy_hashed(src, target, tag, within)
    try:
        written_sha = content_sha256(staged, within=within)
        want = expected_sha256.lower() if expected_sha256 else read_sha
        if written_sha != want or read_sha != want:
            raise PhotoError(
                src,
                f"copy to {target} did not verify: source read as sha256 {read_sha}, "
                f"copy is {written_sha}, expected {want}",
            )
        publish_no_clobber(staged, target, within=within)
    except BaseException:
        within.delete(staged, missing_ok=True)
        raise
    within.delete(src, durable=True)


def _rename_no_clobber(sf: Root, sname: str, tf: Root, tname: str) -> None:
    """Give ``sname``'s file the name ``tname`` and drop the name ``sname``; never overwrite."""
    try:
        rootfs.link(sf, sname, tf, tname)
    except FileExistsError:
        if _same_file(sf, sname, tf, tname):  # an earlier attempt linked, then died before the unlink
            sf.delete(sname)
            return
        raise
    except OSError as exc:
        if exc.errno not in rootfs.NO_LINK_ERRNOS:
            raise
        try:
            rootfs.rename_noreplace(sf, sname, tf, tname)
        except OSError as noreplace:
            if noreplace.errno == errno.ENOSYS:
                raise exc from None
            raise
        return
    sf.delete(sname)


def _same_file(sf: Root, sname: str, tf: Root, tname: str) -> bool:
    a, b = sf.lstat(sname), tf.lstat(tname)
    return a is not None and b is not None and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _fsync_folders(*folders: Root) -> None:
    for folder in {id(f): f for f in folders}.values():
        folder.fsync()


# -- sweeping ------------------------------------------------------------------------------------
def sweep_stray_temps(
    root: str | os.PathLike[str],
    older_than_seconds: float,
    is_live: Callable[[Path], bool] = lambda p: False,
    *,
    now: float | None = None,
) -> list[Path]:
    """Remove staged temp files (``.*.pj-*.tmp``) under the real folder ``root`` whose mtime is
    older than ``older_than_seconds`` and that ``is_live`` does not claim; return the removed paths
    (sorted). The tree is walked by descriptors (``os.fwalk``) and each name removed through its
    folder's: no symlink is followed, on the way or at a name; unreadable folders are skipped."""
    now = time.time() if now is None else now
    removed: list[Path] = []
    with rootfs.open_root(root) as top:
        for dirpath, _dirnames, filenames, dirfd in os.fwalk(".", dir_fd=top.fd):
            swept = False
            for name in filenames:
                if not is_staged_name(name):
                    continue
                path = Path(root, dirpath, name)
                try:
                    st = os.stat(name, dir_fd=dirfd, follow_symlinks=False)
                except FileNotFoundError:
                    continue
                if not _is_regular(st.st_mode) or now - st.st_mtime <= older_than_seconds:
                    continue
                if is_live(path):
                    continue
                try:
                    os.unlink(name, dir_fd=dirfd)
                except FileNotFoundError:
                    continue
                removed.append(Path(os.path.normpath(path)))
                swept = True
            if swept:
                os.fsync(dirfd)
    return sorted(removed)


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def prune_empty_dirs(folder: Path, stop: Path, *, within: Roots) -> None:
    """Remove ``folder`` and its parents while they are empty (e.g. the dated folders a move left),
    up to ``stop`` (kept), each beneath its root (a folder swapped for a symlink stops it)."""
    while folder != stop and stop in folder.parents:
        try:
            within.remove_folder(folder)
        except (OSError, OutsideRoot):
            return
        folder = folder.parent
