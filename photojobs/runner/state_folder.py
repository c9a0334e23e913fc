"""The state folder of ``photojobs run``: its place, its private modes, its lock, its leftover workers."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from types import TracebackType

from rich.console import Console

from photojobs.api import photo_roots
from photojobs.lifeline import start_time, stop_orphans

WORKERS_FILE = "workers.json"
LOCK_NAME = "run.lock"


def state_dir_for(paths: list[str], state: Path | None) -> Path:
    """``--state``, else ``.photojobs/`` next to the first photo root."""
    if state is not None:
        return state.expanduser().resolve()
    roots = photo_roots(paths)  # the roots only: the photos are walked once, by the plan
    base = roots[0] if roots else Path.cwd()
    return base.parent / ".photojobs"


class StateFolderBusy(Exception):
    """Another live ``photojobs run`` holds the state folder's lock."""

    def __init__(self, state_dir: Path, holder: str) -> None:
        self.state_dir = state_dir
        self.holder = holder
        super().__init__(
            f"state folder {state_dir} is in use by {holder}; wait for it to finish, "
            "or pass --wait to start when it does"
        )


def _lock_holder(path: Path) -> str:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return "another photojobs run"
    return f"photojobs run pid {pid}"


def lock_state_folder(state_dir: Path, wait: bool = False, console: Console | None = None) -> int:
    """Take the state folder's lock (``run.lock``, an ``flock`` held for the run's lifetime) and
    return its descriptor; it is released when the process ends, however it ends.  Raises
    :class:`StateFolderBusy` naming the holder, or with ``wait`` blocks until the holder is done."""
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                raise StateFolderBusy(state_dir, holder) from None
            if console is not None:
                console.print(f"waiting for {holder} to finish with {state_dir}", highlight=False)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {start_time(os.getpid())}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the folder itself 0700; tighten it if it exists."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
        path.chmod(0o700)


def make_private_sqlite(url: str, state_dir: Path) -> None:
    """A SQLite store in the state folder is created 0600 before SQLite opens it (its -wal and -shm
    files take the database file's mode); an older, looser one is tightened."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return
    db = Path(url[len(prefix) :])
    if db.parent != state_dir:
        return
    os.close(os.open(db, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)


def stop_leftover_workers(state_dir: Path, console: Console) -> int:
    """Stop the workers a killed ``photojobs run`` on this state folder left behind, found by the
    identity recorded in ``workers.json`` (owner pid and start time, fleet token), never by name;
    the workers of a live owner are never touched."""
    killed = stop_orphans([state_dir / WORKERS_FILE])
    if killed:
        console.print(
            f"stopped {killed} worker process(es) left over from an earlier run that was killed",
            highlight=False,
        )
    return killed


class StateFolder:
    """``with StateFolder(path, wait, console):`` the folder exists (0700) and this run holds its
    lock until the block ends (or the process does)."""

    def __init__(self, path: Path, wait: bool, console: Console) -> None:
        self.path, self.wait, self.console = path, wait, console
        self._fd: int | None = None

    def __enter__(self) -> StateFolder:
        make_private_dir(self.path)
        self._fd = lock_state_folder(self.path, self.wait, self.console)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def workers_file(self) -> Path:
        return self.path / WORKERS_FILE
