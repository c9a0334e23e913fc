"""Root containment, the one implementation: does a path, with every symlink resolved, lie inside a root.

Used at submission (``photojobs.roots``: the paths and destinations a job names) and at the moment
of use (the lanes: the photo they open, the folder they write into, a rename's target). Errors never
say where an outside path leads nor what it holds.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from photos.errors import OutsideRoot, PhotoError
from photos.process_exit import at_exit

PHOTO_ROOTS = "the photo roots"


def is_within(path: str | os.PathLike[str], roots: Iterable[str | os.PathLike[str]]) -> bool:
    """``path`` is one of ``roots`` or below one, compared as written (no symlink is resolved)."""
    p = Path(path)
    return any(p == Path(r) or p.is_relative_to(Path(r)) for r in roots)


def real_roots(roots: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The roots with their symlinks resolved (a root that is itself a symlink is allowed)."""
    return [Path(r).expanduser().resolve() for r in roots]


def resolve_inside(
    path: str | os.PathLike[str],
    roots: Sequence[str | os.PathLike[str]],
    *,
    what: str = PHOTO_ROOTS,
    resolve_roots: bool = True,
) -> Path:
    """The real path of ``path`` (every symlink resolved, relative to the working directory) when it
    is inside one of ``roots``; else :class:`OutsideRoot` saying it is "outside ``what``".

    ``resolve_roots=False`` compares against the roots as given: for roots recorded already resolved
    (a job's roots), so that a root swapped for a symlink later does not carry its files along.
    """
    if not roots:
        raise OutsideRoot(path, f"outside {what}: no roots are known")
    real = Path(path).expanduser().resolve()
    _refuse_outside(path, real, roots, what, resolve_roots)
    return real


def _refuse_outside(
    path: str | os.PathLike[str],
    real: Path,
    roots: Sequence[str | os.PathLike[str]],
    what: str,
    resolve_roots: bool,
) -> None:
    """:class:`OutsideRoot` unless ``real`` (``path``'s real location) lies inside ``roots``."""
    allowed = real_roots(roots) if resolve_roots else [Path(r) for r in roots]
    if not roots or not is_within(real, allowed):
        raise OutsideRoot(path, f"resolves outside {what}")


def _opened(path: str | os.PathLike[str], fd: int) -> None:
    """Called by ``open_inside`` between its ``os.open`` and its check of the descriptor: nothing.
    A test seam only (tests/unit/photos/test_containment.py swaps a symlink here, the race the
    ``/proc/self/fd`` check exists for); the product never sets it."""


def open_inside(
    path: str | os.PathLike[str],
    roots: Sequence[str | os.PathLike[str]],
    *,
    what: str = PHOTO_ROOTS,
    resolve_roots: bool = True,
) -> int:
    """Open ``path`` read-only and return the descriptor, checking the file actually opened: where
    the kernel says the descriptor points (``/proc/self/fd``) must be inside ``roots``. A symlink
    swapped in after any earlier check is caught here, before a byte is read."""
    # non-blocking: a FIFO swapped in must not hang the worker (no effect on a regular file)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        _opened(path, fd)
        link = f"/proc/self/fd/{fd}"
        real = Path(os.readlink(link)) if os.path.exists(link) else Path(path).resolve()
        _refuse_outside(path, real, roots, what, resolve_roots)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_relative(root: str | os.PathLike[str], relpath: str) -> Path:
    """``root / relpath`` with its existing parents resolved, the final name kept (a symlink there
    must point inside ``root`` too); :class:`OutsideRoot` if it leaves the resolved ``root``."""
    real_root = Path(root).expanduser().resolve()
    candidate = real_root / relpath
    parent = candidate.parent.resolve()
    if not is_within(parent, [real_root]):
        raise OutsideRoot(relpath, "its folder resolves outside the root")
    target = parent / candidate.name
    if target.is_symlink() and not is_within(target.resolve(), [real_root]):
        raise OutsideRoot(relpath, "is a symlink that points outside the root")
    return target


PIN_PREFIX = "pj-pin-"
_swept: set[int] = set()
#: (pid, temp folder) -> this process's pin folder (``_pin_folder``)
_pin_folders: dict[tuple[int, str], str] = {}
_pin_numbers = itertools.count()


def _sweep_dead_pins() -> None:
    """Once per process: remove the pin folders of processes that died (a SIGKILLed worker's, or
    one that exited: each holds symlinks to ``/proc/<its pid>/fd/<n>``, never a byte of a photo).
    A folder ``pj-pin-<pid>-…`` (:func:`_pin_folder`) is its process's; an older one, without a
    pid in its name, is a dead process's when every link in it points into a dead process."""
    if os.getpid() in _swept:
        return
    _swept.add(os.getpid())
    tmp = Path(tempfile.gettempdir())
    try:
        folders = [p for p in tmp.iterdir() if p.name.startswith(PIN_PREFIX)]
    except OSError:
        return
    for folder in folders:
        pid = folder.name[len(PIN_PREFIX) :].split("-", 1)[0]
        if pid.isdigit() and folder.name.count("-") >= 3:
            if not os.path.exists(f"/proc/{pid}"):
                shutil.rmtree(folder, ignore_errors=True)
            continue
        try:
            links = [os.readlink(e) for e in folder.iterdir() if e.is_symlink()]
        except OSError:
            continue
        pids = {link.split("/")[2] for link in links if link.startswith("/proc/")}
        if pids and not any(os.path.exists(f"/proc/{pid}") for pid in pids):
            shutil.rmtree(folder, ignore_errors=True)


def _pin_folder() -> str:
    """This process's folder of pins, ``<temp>/pj-pin-<pid>-<random>`` (mode 0700, made by
    ``mkdtemp`` once per process: nobody else can name anything in it), with a folder per thread
    (``t<thread id>``) where a pin is one symlink: a pin costs a ``symlink`` and an ``unlink``, not a
    new temporary folder and a tree walk. Removed when the process ends (:mod:`photos.process_exit`);
    swept by the next process when this one was killed."""
    key = (os.getpid(), tempfile.gettempdir())
    base = _pin_folders.get(key)
    if base is None or not os.path.isdir(base):
        _sweep_dead_pins()
        base = _pin_folders[key] = tempfile.mkdtemp(prefix=f"{PIN_PREFIX}{os.getpid()}-")
        at_exit(shutil.rmtree, base, True)  # removed when the process ends (swept if it is killed)
    folder = f"{base}/t{threading.get_native_id()}"
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    return folder


def private_name(name: str) -> str:
    """``name`` as the pin's private name: the photo's name and extension, with every character a
    tool could read as more than a name — a control character, ``%`` (exiftool's format codes), a
    byte that is not UTF-8 (a surrogate escape), a leading ``-`` or ``.`` — replaced by ``_``."""
    safe = "".join(
        "_" if ch == "%" or ch == "/" or not ch.isprintable() or "\ud800" <= ch <= "\udfff" else ch
        for ch in name
    )
    if safe[:1] in ("-", "."):
        safe = "_" + safe[1:]
    return safe or "photo"


class Pinned:
    """One file opened through :func:`open_inside` and kept open: every read of it — by this
    process (:attr:`fd`, :meth:`sha256`) or by another program given :attr:`name` (exiftool,
    LibRaw) — reads exactly the inode that was checked, whatever happens to its path afterwards.

    :attr:`name` is ``<private folder>/<the photo's own file name>`` (:func:`private_name`), a symlink to
    ``/proc/<this pid>/fd/<fd>`` (the kernel's link to the open file, not a path lookup): it keeps
    the photo's name and extension (format detection, messages) and no other name can be swapped
    under it (the folder is this process's, mode 0700). Where ``/proc`` is missing the folder
    holds a copy read through the descriptor instead."""

    def __init__(self, path: Path, fd: int, entry: os.stat_result) -> None:
        self.path = path
        self.fd = fd
        self.stat = os.fstat(fd)
        #: what the path itself was when it was opened (``lstat``): the file, or a symlink to it
        self.entry = entry
        folder = _pin_folder()
        own = private_name(path.name)
        magic = f"/proc/{os.getpid()}/fd/{fd}"
        #: a folder made for this pin alone (removed with it): a copy, or a name the thread has pinned already
        self._own: str | None = None
        if os.path.exists(magic):
            try:
                os.symlink(magic, f"{folder}/{own}")
            except FileExistsError:  # two pins of one name at once in this thread
                self._own = f"{folder}/{next(_pin_numbers)}"
                os.mkdir(self._own, 0o700)
                os.symlink(magic, f"{self._own}/{own}")
        else:  # no /proc: a private copy of the checked bytes
            self._own = f"{folder}/{next(_pin_numbers)}"
            os.mkdir(self._own, 0o700)
            with open(f"{self._own}/{own}", "wb") as out:
                for chunk in self._chunks():
                    out.write(chunk)
        self.name = Path(self._own or folder) / own

    def _chunks(self) -> Iterator[bytes]:
        offset = 0
        while chunk := os.pread(self.fd, 1024 * 1024, offset):
            offset += len(chunk)
            yield chunk

    def sha256(self) -> str:
        """Hex SHA-256 of the pinned file's bytes (read through the descriptor)."""
        digest = hashlib.sha256()
        for chunk in self._chunks():
            digest.update(chunk)
        return digest.hexdigest()

    @property
    def is_link(self) -> bool:
        """The path was a symlink (to a file inside the roots) when it was pinned."""
        return stat.S_ISLNK(self.entry.st_mode)

    def still_at(self) -> bool:
        """Whether the path still is what was pinned: the same directory entry (device, inode and
        type; for a regular file that is the pinned file itself), not something swapped in."""
        try:
            st = os.lstat(self.path)
        except OSError:
            return False
        was = self.entry
        return (st.st_dev, st.st_ino, stat.S_IFMT(st.st_mode)) == (
            was.st_dev, was.st_ino, stat.S_IFMT(was.st_mode)
        )  # fmt: skip

    @contextmanager
    def as_photo(self) -> Iterator[None]:
        """Errors about :attr:`name` are re-raised naming the photo's path instead."""
        try:
            yield
        except PhotoError as exc:
            if exc.path != str(self.name):
                raise
            reason = exc.reason.replace(str(self.name), str(self.path))
            try:
                renamed = type(exc)(self.path, reason)
            except TypeError:  # pragma: no cover - every PhotoError takes (path, reason)
                raise exc from None
            raise renamed from exc

    def close(self) -> None:
        try:
            os.unlink(self.name)
            if self._own is not None:
                os.rmdir(self._own)
        except OSError:
            if self._own is not None:
                shutil.rmtree(self._own, ignore_errors=True)
        os.close(self.fd)


@contextmanager
def pin_inside(
    path: str | os.PathLike[str],
    roots: Sequence[str | os.PathLike[str]] | None,
    *,
    what: str = PHOTO_ROOTS,
    resolve_roots: bool = True,
) -> Iterator[Pinned]:
    """Open ``path`` checked inside ``roots`` (:func:`open_inside`; ``None``: an unconfined job,
    nothing to check against) and yield it :class:`Pinned`; closed (and its private name removed)
    at the end. Only regular files are pinned."""
    try:
        entry = os.lstat(path)
    except FileNotFoundError:
        raise PhotoError(path, "file not found (deleted or moved after submission)") from None
    if roots is None:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NONBLOCK", 0))
    else:
        fd = open_inside(path, roots, what=what, resolve_roots=resolve_roots)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PhotoError(path, "is not a regular file")
        if stat.S_ISREG(entry.st_mode) and (entry.st_dev, entry.st_ino) != (st.st_dev, st.st_ino):
            raise PhotoError(path, "was replaced while it was being opened")
        pinned = Pinned(Path(path), fd, entry)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield pinned
    finally:
        pinned.close()
