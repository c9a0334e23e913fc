"""A root the jobs cannot leave: every write, move, link, folder and delete beneath a held folder.

A :class:`Root` is a folder held open by descriptor. Every path given to it is relative to it and
is resolved beneath it one component at a time with no symlink followed — ``openat2`` with
``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`` where the kernel has it (Linux 5.6+), else a walk of
``openat(name, O_DIRECTORY | O_NOFOLLOW)`` from the root's descriptor — and the act happens on the
final folder's descriptor (``linkat``, ``renameat``, ``renameat2(RENAME_NOREPLACE)``, ``mkdirat``,
``unlinkat``, ``openat(O_NOFOLLOW)``). A folder on the way that is a symlink, or not a folder, is
refused (:class:`NotBeneath`, naming the path and the component): a folder swapped for a symlink
between a check and the act moves, writes and deletes nothing outside, because no act goes through
a path a symlink could redirect. A root itself is opened by its real path with no symlink followed
either.

:class:`Roots` is the set of real folders one piece of work may change (a job's photo roots, its
archive root, its local upload folder), each opened at its first use and held with the work: an
absolute path is located beneath the deepest root that holds it as written, and acted on there; a
path beneath none is refused (:class:`OutsideRoot`). Issue 39's history store builds on the same
primitives: :meth:`Root.opendir`, :meth:`Root.create`/:meth:`Root.open`, :func:`link`,
:func:`replace`, :func:`rename_noreplace`, :meth:`Root.delete`, :meth:`Root.listdir`.

The anchors: Go 1.24's ``os.Root``, Rust's ``cap-std``, systemd's ``chase()``, ``openat2(2)``. Unlike
``os.Root`` no symlink is followed beneath a root, even one pointing inside: the jobs never need one.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Generic, TypeVar

from photos.errors import OutsideRoot

T = TypeVar("T")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_SYS_OPENAT2 = 437  # one number on every architecture (added after the syscall tables were unified)
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
#: ``PHOTOJOBS_ROOTFS_WALK=1`` resolves by the component walk even where ``openat2`` exists (tests).
WALK_ENV = "PHOTOJOBS_ROOTFS_WALK"
#: errnos meaning "this filesystem cannot hard-link" (exFAT/FAT, some network and FUSE mounts).
NO_LINK_ERRNOS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS})

#: Indirection so tests can simulate a cross-filesystem link or a filesystem without hard links.
_link = os.link


class NotBeneath(OutsideRoot):
    """A path that cannot be reached beneath its root without following a symlink or passing
    through something that is not a folder: nothing is done there."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


_HOW_SIZE = ctypes.c_size_t(ctypes.sizeof(_OpenHow))
_NUMBER = ctypes.c_long(_SYS_OPENAT2)


_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_openat2_state: bool | None = False if os.environ.get(WALK_ENV) else None


def use_openat2(enabled: bool | None) -> None:
    """Resolve with ``openat2`` (True), with the component walk (False), or as the kernel allows
    (None: probed on first use). For tests: both ways are the product's."""
    global _openat2_state
    _openat2_state = enabled


def openat2_available() -> bool:
    """Whether paths are resolved with ``openat2`` (probed once: Linux 5.6+, not filtered away)."""
    global _openat2_state
    if _openat2_state is None:
        try:
            os.close(_openat2(_AT_FDCWD, "/", _DIR, _RESOLVE_NO_SYMLINKS))
            _openat2_state = True
        except OSError:  # ENOSYS (old kernel), EPERM (a seccomp filter), E2BIG: walk instead
            _openat2_state = False
    return _openat2_state


def _openat2(dirfd: int, path: str, flags: int, resolve: int) -> int:
    how = _OpenHow(flags, 0, resolve)
    name = os.fsencode(path)
    for _ in range(16):
        fd = _syscall(_NUMBER, ctypes.c_int(dirfd), name, ctypes.byref(how), _HOW_SIZE)
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err not in (errno.EAGAIN, errno.EINTR):  # EAGAIN: a rename elsewhere raced the check
            raise OSError(err, os.strerror(err), path)
    raise OSError(errno.EAGAIN, os.strerror(errno.EAGAIN), path)


def parts_of(rel: str | os.PathLike[str]) -> tuple[str, ...]:
    """The components of a path beneath a root; ``ValueError`` for an absolute one or one with ``..``.
    (Strings, not ``PurePath``: this runs several times per file operation.)"""
    text = os.fspath(rel)
    parts = tuple(part for part in text.split("/") if part not in ("", "."))
    if text.startswith("/") or ".." in parts:
        raise ValueError(f"{text!r} is not a path beneath a root (absolute, or with '..')")
    return parts


def _join(base: str, parts: tuple[str, ...]) -> str:
    return "/".join((base.rstrip("/"), *parts)) if parts else base


def _walk(dirfd: int, parts: tuple[str, ...]) -> int:
    fd = dirfd
    try:
        for part in parts:
            nxt = os.open(part, _DIR, dir_fd=fd)
            if fd != dirfd:
                os.close(fd)
            fd = nxt
    except BaseException:
        if fd != dirfd:
            os.close(fd)
        raise
    return fd


def _open_dir(dirfd: int, parts: tuple[str, ...], shown: str, *, create: bool = False) -> int:
    """A new descriptor of the folder ``parts`` beneath ``dirfd`` (``NotBeneath`` when a component is
    a symlink or not a folder); with ``create`` the missing folders are made (and made durable)."""
    try:
        if not parts:
            return os.open(".", _DIR, dir_fd=dirfd)
        if openat2_available():
            resolve = _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS
            return _openat2(dirfd, "/".join(parts), _DIR, resolve)
        return _walk(dirfd, parts)
    except FileNotFoundError:
        if not create:
            raise
        return _make_dirs(dirfd, parts, shown)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EXDEV):
            raise _refusal(dirfd, parts, shown) from None
        raise


def _make_dirs(dirfd: int, parts: tuple[str, ...], shown: str) -> int:
    fd = dirfd
    try:
        for part in parts:
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except FileNotFoundError:
                try:
                    os.mkdir(part, 0o777, dir_fd=fd)
                except FileExistsError:
                    pass
                else:
                    os.fsync(fd)  # the new folder's name survives a power cut
                nxt = os.open(part, _DIR, dir_fd=fd)
            if fd != dirfd:
                os.close(fd)
            fd = nxt
    except OSError as exc:
        if fd != dirfd:
            os.close(fd)
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _refusal(dirfd, parts, shown) from None
        raise
    return fd


def _refusal(dirfd: int, parts: tuple[str, ...], shown: str) -> NotBeneath:
    """Which component stopped the walk, said without following it (never where a symlink leads)."""
    fd = dirfd
    try:
        for i, part in enumerate(parts):
            try:
                st = os.stat(part, dir_fd=fd, follow_symlinks=False)
            except OSError:
                break
            where = "/".join(parts[: i + 1])
            if stat.S_ISLNK(st.st_mode):
                return NotBeneath(shown, f"its folder {where} is a symlink; a root is never left through one")
            if not stat.S_ISDIR(st.st_mode):
                return NotBeneath(shown, f"{where} on its way is not a folder; nothing was done")
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError:
                break
            if fd != dirfd:
                os.close(fd)
            fd = nxt
    finally:
        if fd != dirfd:
            os.close(fd)
    return NotBeneath(shown, "a folder on its way is a symlink or not a folder; nothing was done")


class Opened(Generic[T]):
    """What a lookup opened: ``with`` yields it and closes the folders opened for it (a plain
    object, not a generator: it runs several times per file operation)."""

    __slots__ = ("found", "owned")

    def __init__(self, found: T, owned: Iterable[Root]) -> None:
        self.found = found
        self.owned = owned

    def __enter__(self) -> T:
        return self.found

    def __exit__(self, *exc: object) -> None:
        for folder in self.owned:
            folder.close()


class Root:
    """A folder held open by descriptor; every path given to its methods is beneath it (relative,
    no ``..``), reached without following a symlink. :func:`open_root` opens a root by its real path;
    :meth:`opendir` a folder beneath it (itself a ``Root``). Close it (or use ``with``)."""

    __slots__ = ("_path", "fd")

    def __init__(self, path: str | os.PathLike[str], fd: int) -> None:
        self._path = os.fspath(path)
        self.fd = fd

    @property
    def path(self) -> Path:
        """Where the folder was when it was opened (for names and messages; never looked up)."""
        return Path(self._path)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Root:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Root({self._path!r}, fd={self.fd})"

    # -- folders -----------------------------------------------------------------------------
    def opendir(self, rel: str | os.PathLike[str] = "", *, create: bool = False) -> Root:
        """The folder ``rel`` beneath this one, opened (made first with ``create``)."""
        parts = parts_of(rel)
        where = _join(self._path, parts)
        return Root(where, _open_dir(self.fd, parts, where, create=create))

    def parent(self, rel: str | os.PathLike[str], *, create: bool = False) -> Opened[tuple[Root, str]]:
        """``with root.parent(rel) as (folder, name)``: the folder holding ``rel`` (this root itself
        for a bare name), opened beneath it, and its final name."""
        parts = parts_of(rel)
        if not parts:
            raise ValueError("a root has no name beneath itself")
        if len(parts) == 1:
            return Opened((self, parts[0]), ())
        where = _join(self._path, parts[:-1])
        folder = Root(where, _open_dir(self.fd, parts[:-1], _join(self._path, parts), create=create))
        return Opened((folder, parts[-1]), (folder,))

    def makedirs(self, rel: str | os.PathLike[str]) -> None:
        """Make the folder ``rel`` and the missing ones above it (beneath this root)."""
        self.opendir(rel, create=True).close()

    def listdir(self, rel: str | os.PathLike[str] = "") -> list[str]:
        """The names in the folder ``rel`` (read through its descriptor)."""
        if not parts_of(rel):
            return os.listdir(self.fd)
        with self.opendir(rel) as folder:
            return os.listdir(folder.fd)

    def fsync(self) -> None:
        """Make this folder's entries (names created, renamed, removed) durable."""
        os.fsync(self.fd)

    # -- one name --------------------------------------------------------------------------------
    def lstat(self, rel: str | os.PathLike[str]) -> os.stat_result | None:
        """What is at ``rel`` (a symlink there is not followed); None when nothing is."""
        try:
            with self.parent(rel) as (folder, name):
                return os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def is_file(self, rel: str | os.PathLike[str]) -> bool:
        """Whether ``rel`` is a regular file: opened (``O_PATH | O_NOFOLLOW``, a symlink is not one)
        and looked at through that descriptor."""
        try:
            fd = self.open(rel, os.O_PATH)
        except OSError:
            return False
        try:
            return stat.S_ISREG(os.fstat(fd).st_mode)
        finally:
            os.close(fd)

    def open(self, rel: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
        """``openat`` of ``rel`` with ``O_NOFOLLOW``: a symlink at the name is refused (ELOOP)."""
        with self.parent(rel) as (folder, name):
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=folder.fd)

    def create(self, rel: str | os.PathLike[str], mode: int = 0o666) -> int:
        """A new file at ``rel`` opened for writing (``O_CREAT | O_EXCL | O_NOFOLLOW``):
        ``FileExistsError`` when any name (a symlink too) is there already."""
        return self.open(rel, _CREATE, mode)

    def delete(self, rel: str | os.PathLike[str], *, missing_ok: bool = False, durable: bool = False) -> None:
        """Remove the name ``rel`` (a symlink there is removed, never followed); with ``durable``
        the folder is fsynced after."""
        try:
            with self.parent(rel) as (folder, name):
                os.unlink(name, dir_fd=folder.fd)
                if durable:
                    folder.fsync()
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_folder(self, rel: str | os.PathLike[str]) -> None:
        """Remove the empty folder ``rel``."""
        with self.parent(rel) as (folder, name):
            os.rmdir(name, dir_fd=folder.fd)


def open_root(path: str | os.PathLike[str]) -> Root:
    """Open the folder at the absolute ``path`` as a root. It must be a real path: a symlink anywhere
    on it (a root swapped for one), or something that is not a folder, is refused (``NotBeneath``)."""
    text = os.fspath(path)
    if not text.startswith("/"):
        raise ValueError(f"a root is opened by its absolute path, not {text!r}")
    try:
        if openat2_available():
            return Root(text, _openat2(_AT_FDCWD, text, _DIR, _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS))
        top = os.open("/", _DIR)
        try:
            return Root(text, _walk(top, parts_of(text[1:])))
        finally:
            os.close(top)
    except OSError as exc:
        if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
    raise NotBeneath(text, _NOT_REAL)


_NOT_REAL = "the root is no longer a real folder (a symlink, or not a folder, is on its path)"


def _open_root_of(root: Path, path: str | os.PathLike[str]) -> Root:
    """:func:`open_root` for an act on ``path``: a refusal names the file, and its root."""
    try:
        return open_root(root)
    except NotBeneath:
        if Path(path) == root:
            raise
        raise NotBeneath(path, f"its root {root} is no longer a real folder (a symlink on its way)") from None


# -- two names (each in a folder held open) ------------------------------------------------------
def link(src: Root, src_name: str, dst: Root, dst_name: str) -> None:
    """Give the file ``src_name`` of the folder ``src`` the new name ``dst_name`` in ``dst``
    (``linkat`` without following a symlink); ``FileExistsError`` when the name is taken."""
    _link(src_name, dst_name, src_dir_fd=src.fd, dst_dir_fd=dst.fd, follow_symlinks=False)


def link_open_file(fd: int, dst: Root, dst_name: str) -> None:
    """Give the open file ``fd`` the name ``dst_name`` in ``dst`` (``linkat`` of ``/proc/self/fd/N``:
    the kernel's link to the file itself, never a path looked up again)."""
    magic = f"/proc/self/fd/{fd}"
    if not os.path.exists(magic):
        raise OSError(errno.ENOSYS, "no /proc to link an open file from", str(dst.path / dst_name))
    _link(magic, dst_name, dst_dir_fd=dst.fd, follow_symlinks=True)


def replace(src: Root, src_name: str, dst: Root, dst_name: str) -> None:
    """``renameat``: ``src_name`` takes the place of ``dst_name`` (overwriting it), atomically."""
    os.replace(src_name, dst_name, src_dir_fd=src.fd, dst_dir_fd=dst.fd)


def rename_noreplace(src: Root, src_name: str, dst: Root, dst_name: str) -> None:
    """``renameat2(RENAME_NOREPLACE)``: the rename fails with ``FileExistsError`` instead of
    overwriting; ``OSError(ENOSYS)`` where the kernel or filesystem cannot do it."""
    try:
        renameat2 = _libc.renameat2
    except AttributeError:
        raise OSError(errno.ENOSYS, "renameat2 is not available", src_name) from None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    if renameat2(src.fd, os.fsencode(src_name), dst.fd, os.fsencode(dst_name), _RENAME_NOREPLACE) != 0:
        err = ctypes.get_errno()
        if err == errno.EINVAL:
            err = errno.ENOSYS
        raise OSError(err, os.strerror(err), str(src.path / src_name), None, str(dst.path / dst_name))


# -- the roots of one piece of work --------------------------------------------------------------
class Roots:
    """The real folders one piece of work may change. An absolute path is located beneath the
    deepest of them that holds it (compared as written) and acted on there, each folder on its way
    reached without following a symlink; a path beneath none is refused (``OutsideRoot``).

    Each root is opened (by its real path, no symlink followed) at its first use and held until
    :meth:`close` (or ``with``, or the object's end): the work's later acts happen beneath the very
    folder the first one opened, never a path looked up again."""

    def __init__(self, paths: Iterable[str | os.PathLike[str]]) -> None:
        unique = {Path(p) for p in paths}
        self.paths = sorted(unique, key=lambda p: (-len(p.parts), str(p)))
        # (root, its text, the prefix of the paths beneath it): located by strings, not PurePaths
        self._located = [(p, str(p), str(p).rstrip("/") + "/") for p in self.paths]
        self._held: dict[Path, Root] = {}
        self._closer = weakref.finalize(self, _close_all, self._held)

    def close(self) -> None:
        """Close the roots held open (a later act opens them again)."""
        _close_all(self._held)

    def __enter__(self) -> Roots:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _root(self, where: Path, path: str | os.PathLike[str]) -> Root:
        found = self._held.get(where)
        if found is None:
            found = self._held[where] = _open_root_of(where, path)
        return found

    def __repr__(self) -> str:
        return f"Roots({[str(p) for p in self.paths]!r})"

    def locate(self, path: str | os.PathLike[str]) -> tuple[Path, str]:
        """``(root, path relative to it)``: the deepest root holding ``path`` (as written)."""
        text = os.fspath(path)
        for root, exact, prefix in self._located:
            if text == exact:
                return root, ""
            if text.startswith(prefix):
                return root, text[len(prefix) :]
        raise OutsideRoot(path, "is outside the job's roots; nothing is written, moved or removed there")

    def root_of(self, path: str | os.PathLike[str]) -> tuple[Root, str]:
        """``(the root holding path, held open; path relative to it)``."""
        where, rel = self.locate(path)
        return self._root(where, path), rel

    def folders(
        self, *paths: str | os.PathLike[str], create: bool = False
    ) -> Opened[list[tuple[Root, str]]]:
        """``with fs.folders(a, b) as [(folder, name), …]``: the folder holding each path, opened
        beneath its root, and its name; each folder opened once (two names in one folder share its
        descriptor); with ``create`` missing folders are made."""
        return self._folders(paths, create)

    def folder_of(self, path: str | os.PathLike[str], *, create: bool = False) -> Opened[tuple[Root, str]]:
        """``with fs.folder_of(path) as (folder, name)``: :meth:`folders` of one path."""
        found = self._folders((path,), create)
        return Opened(found.found[0], found.owned)

    def _folders(
        self, paths: Iterable[str | os.PathLike[str]], create: bool
    ) -> Opened[list[tuple[Root, str]]]:
        opened: dict[str, Root] = {}
        owned: list[Root] = []
        out = []
        try:
            for path in paths:
                text = os.fspath(path)
                where, rel = self.locate(text)
                parts = parts_of(rel)
                if not parts:
                    raise ValueError(f"{text} is a root itself, not a name beneath one")
                parent = text.rpartition("/")[0] or "/"
                folder = opened.get(parent)
                if folder is None:
                    root = self._root(where, text)
                    if len(parts) == 1:
                        folder = root
                    else:
                        folder = Root(parent, _open_dir(root.fd, parts[:-1], text, create=create))
                        owned.append(folder)
                    opened[parent] = folder
                out.append((folder, parts[-1]))
        except BaseException:
            for folder in owned:
                folder.close()
            raise
        return Opened(out, owned)

    def opendir(self, path: str | os.PathLike[str], *, create: bool = False) -> Root:
        """The folder at ``path`` opened beneath its root (a ``Root`` the caller closes)."""
        root, rel = self.root_of(path)
        return root.opendir(rel, create=create)

    def makedirs(self, path: str | os.PathLike[str]) -> None:
        root, rel = self.root_of(path)
        root.makedirs(rel)

    def lstat(self, path: str | os.PathLike[str]) -> os.stat_result | None:
        """What is at ``path`` (not followed), None when nothing is (or its folder, or its root, is
        not there)."""
        try:
            root, rel = self.root_of(path)
        except FileNotFoundError:
            return None
        return root.lstat(rel)

    def open(self, path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o666) -> int:
        root, rel = self.root_of(path)
        return root.open(rel, flags, mode)

    def delete(
        self, path: str | os.PathLike[str], *, missing_ok: bool = False, durable: bool = False
    ) -> None:
        root, rel = self.root_of(path)
        root.delete(rel, missing_ok=missing_ok, durable=durable)

    def remove_folder(self, path: str | os.PathLike[str]) -> None:
        root, rel = self.root_of(path)
        root.remove_folder(rel)

    def listdir(self, path: str | os.PathLike[str]) -> list[str]:
        root, rel = self.root_of(path)
        return root.listdir(rel)


def _close_all(held: dict[Path, Root]) -> None:
    while held:
        held.popitem()[1].close()


def ensure_folder(path: str | os.PathLike[str], within: Iterable[str | os.PathLike[str]] | None) -> None:
    """Make the folder ``path`` a job writes into (an upload folder, an archive root). With
    ``within`` (the real roots a confined job was given) it is made beneath the deepest of them
    holding it, no symlink followed; without (an operator's own job, unconfined) by its path as the
    operator wrote it."""
    if within is None:
        os.makedirs(path, exist_ok=True)
        return
    Roots(within).makedirs(path)


def is_regular(st: os.stat_result | None) -> bool:
    return st is not None and stat.S_ISREG(st.st_mode)
