"""Safe file operations for the exactly-once protocol: stage, verify, publish.

Every output is first written to a *staged* temp file next to its target
(``.{name}.pj-{tag}.tmp``), flushed and fsynced, then published with one atomic step:

* :func:`replace_atomic` overwrites in place (``os.replace``), e.g. a metadata edit;
* :func:`publish_no_clobber` creates a new name and never overwrites (hard link, or
  ``renameat2(RENAME_NOREPLACE)`` on filesystems without hard links, such as exFAT);
* :func:`move_no_clobber` moves a file, copying and verifying across filesystems.

Directories are fsynced after each publish so the new name survives a power cut.
:func:`sweep_stray_temps` removes staged files left behind by crashed attempts.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from photos.containment import open_inside, resolve_inside
from photos.errors import InvalidParameter, OutsideRoot, PhotoError

CHUNK = 1024 * 1024
_TAG_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_STAGED_RE = re.compile(r"^\..+\.pj-[A-Za-z0-9_.-]{1,64}\.tmp$", re.DOTALL)
_NAME_MAX = 255

#: Indirection so tests can simulate a cross-filesystem link (``OSError(errno.EXDEV)``).
_link = os.link

# errnos meaning "this filesystem cannot hard-link" (exFAT/FAT, some network and FUSE mounts).
_NO_LINK_ERRNOS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS}


def sha256_file(
    path: str | os.PathLike[str],
    *,
    roots: Sequence[str | os.PathLike[str]] | None = None,
    nofollow: bool = False,
) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks. With ``roots`` (recorded already resolved) the
    file actually opened must lie inside them (:func:`photos.containment.open_inside`): a hash taken
    this way ties later work that verifies it (a staged copy, an S3 checksum) to a file inside.
    With ``nofollow`` a symlink at ``path`` is refused (``OSError`` ELOOP), never followed."""
    digest = hashlib.sha256()
    if nofollow:
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fh = os.fdopen(os.open(path, flags | getattr(os, "O_NONBLOCK", 0)), "rb")
    elif roots is None:
        fh = open(path, "rb")  # noqa: SIM115 - closed below
    else:
        fh = os.fdopen(open_inside(path, roots, resolve_roots=False), "rb")
    with fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


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


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync a directory so that entries created, renamed or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stage_with(target: str | os.PathLike[str], tag: str, writer: Callable[[BinaryIO], None]) -> Path:
    """Create the staged file for ``target`` (and its parent directories), let ``writer`` fill it,
    flush + fsync it and its directory; return its path. A stale staged file of the same tag is
    overwritten; on error the staged file is removed and the error re-raised."""
    staged = staged_path(target, tag)
    staged.parent.mkdir(parents=True, exist_ok=True)
    _unlink_quietly(staged)  # never write through whatever (even a symlink) sits at that name
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(staged, flags, 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            writer(fh)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        _unlink_quietly(staged)
        raise
    fsync_dir(staged.parent)
    return staged


def stage_bytes(target: str | os.PathLike[str], tag: str, data: bytes) -> Path:
    """Stage ``data`` as the future content of ``target``; return the staged path."""

    def write(fh: BinaryIO) -> None:
        fh.write(data)

    return stage_with(target, tag, write)


def stage_copy(src: str | os.PathLike[str], target: str | os.PathLike[str], tag: str) -> Path:
    """Stage a copy of ``src`` (content, permission bits and timestamps) next to ``target``."""
    staged, _ = _stage_copy_hashed(Path(src), Path(target), tag)
    return staged


def _stage_copy_hashed(src: Path, target: Path, tag: str) -> tuple[Path, str]:
    """Copy ``src`` to a staged file next to ``target``; return it and the SHA-256 of what was read."""
    digest = hashlib.sha256()

    def write(fh: BinaryIO) -> None:
        with open(src, "rb") as source:
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

    return stage_with(target, tag, write), digest.hexdigest()


# -- publishing ----------------------------------------------------------------------------------
def replace_atomic(staged: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Atomically put ``staged`` in place of ``target`` (overwriting it) and fsync the directory.

    Raises FileNotFoundError when ``staged`` no longer exists: the edit was already applied by
    another attempt (or swept), so a late attempt must not apply anything.
    """
    staged, target = Path(staged), Path(target)
    try:
        os.replace(staged, target)
    except FileNotFoundError as exc:
        if not os.path.lexists(staged):
            raise FileNotFoundError(
                errno.ENOENT, "staged file is gone (already applied or swept)", str(staged)
            ) from exc
        raise
    _fsync_dirs(staged.parent, target.parent)


def publish_no_clobber(staged: str | os.PathLike[str], target: str | os.PathLike[str]) -> None:
    """Give ``staged`` the name ``target`` without ever overwriting an existing ``target``.

    ``os.link`` then unlink of the staged name (``renameat2(RENAME_NOREPLACE)`` where the
    filesystem has no hard links); directories are fsynced. Raises FileExistsError if
    ``target`` exists, FileNotFoundError if ``staged`` is gone. If ``target`` already *is* the
    staged file (an earlier attempt linked it and crashed before unlinking) the publish is
    completed instead of failing.
    """
    staged, target = Path(staged), Path(target)
    _rename_no_clobber(staged, target)
    _fsync_dirs(staged.parent, target.parent)


def move_no_clobber(
    src: str | os.PathLike[str],
    target: str | os.PathLike[str],
    expected_sha256: str | None = None,
    *,
    tag: str = "move",
) -> None:
    """Move ``src`` to ``target``, never overwriting an existing ``target``.

    Same filesystem: hard link + unlink (or ``renameat2(RENAME_NOREPLACE)``). Across filesystems
    (EXDEV): copy to a staged file next to ``target``, fsync, verify its SHA-256 against
    ``expected_sha256`` (or, if None, against the hash of what was read from ``src``), publish
    it with :func:`publish_no_clobber`, then unlink ``src``. Raises FileExistsError if
    ``target`` exists, FileNotFoundError if ``src`` is missing, and PhotoError if the copy does
    not verify (``src`` is then left untouched and the staged copy removed).
    """
    src, target = Path(src), Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        _rename_no_clobber(src, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    else:
        _fsync_dirs(src.parent, target.parent)
        return
    _move_across_filesystems(src, target, expected_sha256, tag)


def _move_across_filesystems(src: Path, target: Path, expected_sha256: str | None, tag: str) -> None:
    if os.path.lexists(target):
        raise FileExistsError(errno.EEXIST, "target already exists", str(target))
    staged, read_sha = _stage_copy_hashed(src, target, tag)
    try:
        written_sha = sha256_file(staged)
        want = expected_sha256.lower() if expected_sha256 else read_sha
        if written_sha != want or read_sha != want:
            raise PhotoError(
                src,
                f"copy to {target} did not verify: source read as sha256 {read_sha}, "
                f"copy is {written_sha}, expected {want}",
            )
        publish_no_clobber(staged, target)
    except BaseException:
        _unlink_quietly(staged)
        raise
    os.unlink(src)
    fsync_dir(src.parent)


def _rename_no_clobber(src: Path, target: Path) -> None:
    """Give ``src``'s file the name ``target`` and drop the name ``src``; never overwrite."""
    try:
        _link(src, target)
    except FileExistsError:
        if _same_file(src, target):  # an earlier attempt linked, then died before the unlink
            os.unlink(src)
            return
        raise
    except OSError as exc:
        if exc.errno not in _NO_LINK_ERRNOS:
            raise
        _renameat2_noreplace(src, target, exc)
        return
    os.unlink(src)


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def _renameat2_noreplace(src: Path, target: Path, cause: OSError) -> None:
    """Atomic rename that fails with EEXIST instead of overwriting (Linux ``renameat2``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        raise cause from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EINVAL):
            raise cause
        raise OSError(err, os.strerror(err), str(src), None, str(target))


def _fsync_dirs(*dirs: Path) -> None:
    for d in dict.fromkeys(os.path.abspath(d) for d in dirs):
        fsync_dir(d)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


# -- roots and sweeping --------------------------------------------------------------------------
def ensure_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """Resolve ``path`` (relative paths are taken relative to ``root``; symlinks followed) and
    return it; raise OutsideRoot if it is not ``root`` itself or inside it."""
    candidate = Path(path)
    if not candidate.is_absolute():
        candidate = Path(root) / candidate
    try:
        return resolve_inside(candidate, [root], what=f"the root {Path(root)}")
    except OutsideRoot:
        raise OutsideRoot(path, f"resolves outside the root {Path(root)}") from None


def sweep_stray_temps(
    root: str | os.PathLike[str],
    older_than_seconds: float,
    is_live: Callable[[Path], bool] = lambda p: False,
    *,
    now: float | None = None,
) -> list[Path]:
    """Remove staged temp files (``.*.pj-*.tmp``) under ``root`` whose mtime is older than
    ``older_than_seconds`` and that ``is_live`` does not claim; return the removed paths (sorted).

    Symlinks are neither followed nor removed; unreadable directories are skipped.
    """
    now = time.time() if now is None else now
    removed: list[Path] = []
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            if not is_staged_name(name):
                continue
            path = Path(dirpath) / name
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not _is_regular(st.st_mode) or now - st.st_mtime <= older_than_seconds:
                continue
            if is_live(path):
                continue
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            removed.append(path)
    for d in dict.fromkeys(p.parent for p in removed):
        fsync_dir(d)
    return sorted(removed)


def _is_regular(mode: int) -> bool:
    return stat.S_ISREG(mode)


def prune_empty_dirs(folder: Path, stop: Path) -> None:
    """Remove ``folder`` and its parents while they are empty (e.g. the dated folders a move left),
    up to ``stop`` (kept)."""
    while folder != stop and stop in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent
