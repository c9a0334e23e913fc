"""Worker processes that die with their supervisor, and records to find the orphans of older ones.

**The lifeline.** A supervisor (``photojobs worker`` / ``run``) opens a pipe and keeps its write end
to itself (close-on-exec, so no other program inherits it); every worker command gets the read end
(``pass_fds``) and its number in ``PHOTOJOBS_LIFELINE_FD``.  Nobody ever writes to the pipe: the
read end sees end-of-file exactly when the last holder of the write end is gone, i.e. when the
supervisor process has ended for any reason: a normal exit, a crash, SIGKILL, the OOM killer.

``python -m photojobs.dramatiq_worker`` (the worker command) watches the read end from a thread in the
``dramatiq`` main process *and*, through an ``os.register_at_fork`` hook, in every worker process
dramatiq forks (they inherit the descriptor).  Whichever notices first SIGKILLs the worker's whole
process group (its own session: dramatiq's main process, its worker processes and the exiftool
processes they started) and exits.  A worker whose supervisor died therefore stops within
milliseconds, as a SIGKILLed worker would: its leases expire and the sweeper recovers its items.

Why not ``PR_SET_PDEATHSIG``: it fires when the *thread* that forked the child ends, not the
process (the supervisor restarts workers from short-lived threads), and it does not reach the
processes dramatiq forks from its main process.  The pipe covers every process that inherits it.

**Fleet records.** The supervisor also records its fleet (``workers.json``): its own pid and start
time, a random token that every worker carries in ``PHOTOJOBS_FLEET_TOKEN``, and each worker's pid
and start time.  :func:`stop_orphans` reads such records and, for a record whose owner is no longer
alive (pid gone, or reused by a process with another start time), SIGKILLs the processes that carry
that record's token: the recorded workers and the members of their process groups, each checked by
token (and the recorded ones also by start time).  A process is never chosen by its name.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

ENV_FD = "PHOTOJOBS_LIFELINE_FD"
ENV_TOKEN = "PHOTOJOBS_FLEET_TOKEN"  # noqa: S105 - the name of an environment variable, not a secret
EXIT_ORPHANED = 70

log = logging.getLogger(__name__)


# -- /proc helpers ----------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ")".
    return stat.rsplit(")", 1)[-1].split()


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), or None
    when there is no such live process.  Together with the pid it names one process for good."""
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 20 or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def is_alive(pid: int, started: int | None) -> bool:
    """True while the process ``pid`` that started at ``started`` still lives (not a reused pid)."""
    now = start_time(pid)
    return now is not None and (started is None or now == started)


def _pgrp(pid: int) -> int | None:
    fields = _stat_fields(pid)
    if fields is None or len(fields) < 3 or fields[0] in ("Z", "X"):
        return None
    return int(fields[2])


def _carries_token(pid: int, token: str) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{ENV_TOKEN}={token}".encode() in environ


def _all_pids() -> list[int]:
    try:
        return [int(e) for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []


# -- the supervisor's side --------------------------------------------------------------------------


class Lifeline:
    """The pipe whose write end only the supervisor holds (see the module docstring)."""

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe()  # both close-on-exec; Popen's pass_fds opens one
        self.closed = False

    def child_env(self) -> dict[str, str]:
        return {ENV_FD: str(self.read_fd)}

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for fd in (self.read_fd, self._write_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)


@dataclass(frozen=True)
class FleetRecord:
    owner_pid: int
    owner_start: int | None
    token: str
    workers: list[tuple[int, int | None]]

    def owner_alive(self) -> bool:
        return is_alive(self.owner_pid, self.owner_start)


def write_record(path: Path, token: str, workers: Iterable[int]) -> None:
    """Record this process as the owner of ``workers`` (pids) carrying ``token``; atomic, mode 0600."""
    data = {
        "owner": {"pid": os.getpid(), "start": start_time(os.getpid())},
        "token": token,
        "workers": [{"pid": pid, "start": start_time(pid)} for pid in workers],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_record(path: Path) -> FleetRecord | None:
    """The record in ``path``; None when it is missing or not a fleet record."""
    try:
        data = json.loads(path.read_text())
        owner = data["owner"]
        return FleetRecord(
            owner_pid=int(owner["pid"]),
            owner_start=owner.get("start"),
            token=str(data["token"]),
            workers=[(int(w["pid"]), w.get("start")) for w in data["workers"]],
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def fleet_processes(record: FleetRecord) -> list[int]:
    """Live processes of a recorded fleet: recorded workers with their start time and token, and
    members of their process groups that carry the token."""
    found: set[int] = set()
    groups: set[int] = set()
    for pid, started in record.workers:
        groups.add(pid)  # each worker leads its own session and process group
        if is_alive(pid, started) and _carries_token(pid, record.token):
            found.add(pid)
    for pid in _all_pids():
        if pid in found or pid == os.getpid():
            continue
        if _pgrp(pid) in groups and _carries_token(pid, record.token):
            found.add(pid)
    return sorted(found)


def stop_orphans(paths: Iterable[Path]) -> int:
    """SIGKILL the workers of every record in ``paths`` whose owner is dead, then delete those
    records; records of live owners are left alone.  Returns how many processes were killed."""
    killed = 0
    for path in paths:
        record = read_record(path)
        if record is None:
            with contextlib.suppress(OSError):
                if path.exists() and path.stat().st_size == 0:
                    path.unlink()
            continue
        if record.owner_alive() and record.owner_pid != os.getpid():
            continue
        for pid in fleet_processes(record):
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                continue
        with contextlib.suppress(OSError):
            path.unlink()
    return killed


def runtime_dir() -> Path:
    """Where ``photojobs worker`` records its fleets: ``$PHOTOJOBS_RUNTIME_DIR``, else
    ``$XDG_RUNTIME_DIR/photojobs``, else ``/tmp/photojobs-<uid>``; created 0700 and owned by us."""
    base = os.environ.get("PHOTOJOBS_RUNTIME_DIR")
    if base:
        folder = Path(base)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        folder = Path(os.environ["XDG_RUNTIME_DIR"]) / "photojobs"
    else:
        folder = Path(tempfile.gettempdir()) / f"photojobs-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        st = os.lstat(folder)
        if not os.path.isdir(folder) or os.path.islink(folder) or st.st_uid != os.getuid():
            raise RuntimeError(f"refusing to use {folder}: not a directory owned by us") from None
    return folder


# -- the worker's side ------------------------------------------------------------------------------

_watched: dict[str, int | None] = {}


def _watch(fd: int, pgid: int | None) -> None:
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
    with contextlib.suppress(OSError):
        os.write(2, f"photojobs: supervisor gone; worker pid {os.getpid()} stops now\n".encode())
    if pgid is not None:
        with contextlib.suppress(OSError):
            if os.getpgid(0) == pgid:
                os.killpg(pgid, signal.SIGKILL)
    os._exit(EXIT_ORPHANED)


def _start_watcher() -> None:
    fd, pgid = _watched.get("fd"), _watched.get("pgid")
    if fd is None:
        return
    threading.Thread(target=_watch, args=(fd, pgid), name="photojobs-lifeline", daemon=True).start()


def watch_from_env() -> bool:
    """In a worker command: exit (taking the process group along) when the supervisor is gone, in
    this process and in every process it forks.  False when no lifeline was given."""
    raw = os.environ.get(ENV_FD)
    if not raw:
        return False
    try:
        fd = int(raw)
        os.fstat(fd)
    except (ValueError, OSError):
        print(f"photojobs: {ENV_FD}={raw!r} is not an open descriptor; no lifeline", file=sys.stderr)
        return False
    _watched["fd"] = fd
    # Our own session (the supervisor starts each worker with start_new_session): the group is ours.
    _watched["pgid"] = os.getpid() if os.getpgid(0) == os.getpid() else None
    if not _watched.get("hooked"):
        os.register_at_fork(after_in_child=_start_watcher)
        _watched["hooked"] = 1
    _start_watcher()
    return True
