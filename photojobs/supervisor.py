"""Supervise N worker processes and restart each one alone when it dies.

Why this exists: the ``dramatiq`` CLI treats its worker processes as one unit — when any of them
dies (a crash, an OOM kill, a SIGKILL), the main process shuts *all* of them down and exits.  For a
long-running photo runtime that turns one bad image into a full outage.  So ``photojobs run``
starts N independent ``dramatiq ... --processes 1`` commands and this supervisor keeps each of them
alive on its own:

* every worker runs in its own session / process group (``start_new_session=True``), so a signal
  aimed at one worker (or its children) never reaches the others;
* one waiter thread per slot blocks on its child; when the child exits for *any* reason while we
  are not stopping (exit 0, non-zero status, a signal including SIGKILL), what it left in its
  process group is terminated and the slot is restarted alone after an exponential backoff
  (``backoff_initial * 2**(n-1)``, capped at ``backoff_max``, ``n`` = crashes in the window);
* more than ``max_restarts`` crashes of one slot within ``restart_window`` seconds make the
  supervisor give up on that slot (event ``gave_up``); :attr:`Supervisor.failed` and
  :attr:`Supervisor.gave_up_slots` tell the caller, the other slots keep running;
* :meth:`Supervisor.stop` sends SIGTERM to every worker (dramatiq shuts down gracefully on
  SIGTERM and forwards it to its worker processes), waits up to ``timeout`` for each process group
  to empty, then SIGKILLs the stragglers' groups.  No restart happens once stop has begun.
  SIGTERM deliberately goes to the worker's own process, not its whole group: a dramatiq worker
  process that gets SIGTERM twice (once from the group signal, once forwarded by its main
  process) stops *immediately* ("Killing worker process...") instead of finishing its messages.

Workers die with the supervisor: each worker gets the read end of the supervisor's lifeline pipe
(:mod:`photojobs.lifeline`) and a fleet token in its environment; with ``record``, the fleet
(owner pid and start time, token, worker pids and start times) is written to that file after every
spawn, so that a later supervisor can find the orphans of a dead one by identity
(:func:`photojobs.lifeline.stop_orphans`).

Events (:class:`SupervisorEvent`) are logged and passed to ``on_event``, which is called from the
supervisor's threads: keep it quick and thread-safe.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from photojobs.lifeline import ENV_TOKEN, Lifeline, write_record

__all__ = ["Supervisor", "SupervisorEvent", "exit_reason", "store_recorder"]

logger = logging.getLogger(__name__)

CommandFactory = Callable[[int], Sequence[str]]


def exit_reason(returncode: int | None) -> str:
    """Why a worker process ended: ``killed`` (by a signal), ``recycled`` (a clean exit nobody
    asked for: the worker ended itself) or ``crashed`` (a non-zero exit status)."""
    if returncode is not None and returncode < 0:
        return "killed"
    return "recycled" if returncode == 0 else "crashed"


def store_recorder(engine: Any) -> Callable[[SupervisorEvent], None]:
    """An ``on_event`` that records each unexpected exit in the store (``store.workers.record_exit``:
    the ``photojobs_worker_restarts_total{reason}`` counter); a failed record is logged, never raised."""
    import socket

    from store.workers import record_exit

    def record(event: SupervisorEvent) -> None:
        if event.kind != "exited":
            return
        try:
            record_exit(
                engine,
                exit_reason(event.returncode),
                worker=f"{socket.gethostname()}:{event.pid}",
                detail={"slot": event.index, "returncode": event.returncode, "signal": event.signal},
            )
        except Exception:  # noqa: BLE001 - a store outage must not stop the supervisor's restarts
            logger.warning("cannot record worker %d's exit in the store", event.index, exc_info=True)

    return record


@dataclass(frozen=True)
class SupervisorEvent:
    """Something that happened to one worker slot.

    ``kind`` is one of ``started`` (first spawn), ``exited`` (unexpected exit; ``returncode`` /
    ``signal`` say how), ``restarted`` (new ``pid`` after backoff), ``spawn_failed`` (the command
    could not be executed), ``gave_up`` (too many crashes: the slot stays down).
    """

    kind: str
    index: int
    pid: int | None
    returncode: int | None = None
    signal: str | None = None
    restarts: int = 0
    message: str = ""
    time: float = field(default_factory=time.time)


def _signal_name(returncode: int | None) -> str | None:
    if returncode is None or returncode >= 0:
        return None
    try:
        return signal.Signals(-returncode).name
    except ValueError:
        return f"signal {-returncode}"


def _group_members(pgid: int) -> list[int]:
    """Live (non-zombie) pids in process group ``pgid``, from /proc (Linux)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        # fields: state ppid pgrp ...
        if len(fields) >= 3 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _signal_worker(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    """Signal the worker's process group, and the worker itself if it has left that group."""
    _killpg(proc.pid, sig)
    if proc.returncode is not None:
        return
    try:
        in_own_group = os.getpgid(proc.pid) == proc.pid
    except ProcessLookupError:
        return
    if not in_own_group:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)


def _terminate(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[subprocess.Popen[bytes]]:
    """End workers and everything in their process groups; return those that needed SIGKILL.

    SIGTERM goes to each worker's own process only: dramatiq's main process forwards it to its
    worker processes, and a second SIGTERM (which signalling the whole group would deliver to them)
    makes a dramatiq worker process exit at once instead of finishing its messages.  Once a worker
    is gone, whatever is left in its group gets SIGTERM (nobody else will forward it); after
    ``timeout`` seconds the groups that still have members get SIGKILL.
    """
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
    leftovers_signalled: set[int] = set()
    deadline = time.monotonic() + timeout
    remaining = list(procs)
    while True:
        remaining = [p for p in remaining if p.poll() is None or _group_members(p.pid)]
        for proc in remaining:
            if proc.returncode is not None and proc.pid not in leftovers_signalled:
                leftovers_signalled.add(proc.pid)
                _killpg(proc.pid, signal.SIGTERM)
        if not remaining or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    for proc in remaining:
        _signal_worker(proc, signal.SIGKILL)
    return remaining


class _Slot:
    def __init__(self, index: int) -> None:
        self.index = index
        self.process: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.crash_times: collections.deque[float] = collections.deque()
        self.gave_up = False
        self.thread: threading.Thread | None = None


class Supervisor:
    """Run ``count`` worker commands, restarting each alone when it dies (see module docstring).

    ``commands`` is a list of argv lists (one per slot; ``count`` defaults to its length) or a
    factory ``make_command(index) -> argv`` (``count`` required).  ``env`` is the complete
    environment of the workers, as for :class:`subprocess.Popen` (None inherits ours).  With
    ``log_dir``, worker stdout/stderr are appended to ``log_dir/worker-<index>.log``; otherwise
    they are inherited.  When a worker dies, what it left in its process group gets SIGTERM and,
    after ``orphan_grace`` seconds, SIGKILL, before the slot is restarted.
    """

    def __init__(
        self,
        commands: Sequence[Sequence[str]] | CommandFactory,
        count: int | None = None,
        env: Mapping[str, str] | None = None,
        *,
        backoff_initial: float = 0.5,
        backoff_max: float = 10.0,
        max_restarts: int = 5,
        restart_window: float = 60.0,
        on_event: Callable[[SupervisorEvent], None] | None = None,
        log_dir: Path | str | None = None,
        cwd: Path | str | None = None,
        orphan_grace: float = 10.0,
        record: Path | str | None = None,
    ) -> None:
        if callable(commands):
            if count is None:
                raise ValueError("count is required with a command factory")
            self._make_command: CommandFactory = commands
        else:
            fixed = [list(c) for c in commands]
            if count is None:
                count = len(fixed)
            if count != len(fixed):
                raise ValueError(f"count={count} but {len(fixed)} commands were given")
            self._make_command = lambda index: fixed[index]
        if count < 1:
            raise ValueError("count must be at least 1")
        self.count = count
        self.env = dict(env) if env is not None else None
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.on_event = on_event
        self.log_dir = Path(log_dir) if log_dir is not None else None
        self.cwd = cwd
        self.orphan_grace = orphan_grace
        self.record = Path(record) if record is not None else None
        self.token = uuid.uuid4().hex
        self._lifeline: Lifeline | None = None
        self._slots = [_Slot(i) for i in range(count)]
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._started = False
        self._stopped = False

    # -- public state ------------------------------------------------------------------------

    def pids(self) -> list[int | None]:
        """Current pid per slot; None while a slot is down (backoff, given up, stopped)."""
        with self._lock:
            return [
                s.process.pid if s.process is not None and s.process.returncode is None else None
                for s in self._slots
            ]

    @property
    def restarts(self) -> int:
        """Total number of restarts over all slots."""
        with self._lock:
            return sum(s.restarts for s in self._slots)

    def restart_counts(self) -> list[int]:
        """Restarts per slot."""
        with self._lock:
            return [s.restarts for s in self._slots]

    @property
    def gave_up_slots(self) -> list[int]:
        """Indexes of the slots the supervisor gave up on."""
        with self._lock:
            return [s.index for s in self._slots if s.gave_up]

    @property
    def failed(self) -> bool:
        """True once the supervisor has given up on at least one slot."""
        return bool(self.gave_up_slots)

    # -- internals ---------------------------------------------------------------------------

    def _emit(self, event: SupervisorEvent) -> None:
        level = (
            logging.ERROR
            if event.kind in ("gave_up", "spawn_failed")
            else (logging.WARNING if event.kind == "exited" else logging.INFO)
        )
        logger.log(level, "worker %d %s: %s", event.index, event.kind, event.message)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:  # a broken callback must not kill the supervisor
                logger.exception("supervisor on_event callback failed")

    def _open_log(self, index: int) -> IO[bytes] | None:
        if self.log_dir is None:
            return None
        self.log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Private (0600): a worker's log names the photos it works on.
        fd = os.open(self.log_dir / f"worker-{index}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        log = os.fdopen(fd, "ab")  # closed right after the spawn
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        log.write(f"--- photojobs supervisor: starting worker {index} at {stamp}\n".encode())
        log.flush()
        return log

    def _spawn(self, slot: _Slot) -> subprocess.Popen[bytes]:
        """Start the slot's command (caller holds the lock)."""
        argv = list(self._make_command(slot.index))
        if self._lifeline is None:
            self._lifeline = Lifeline()
        env = dict(os.environ if self.env is None else self.env)
        env.update(self._lifeline.child_env())
        env[ENV_TOKEN] = self.token
        log = self._open_log(slot.index)
        try:
            proc = subprocess.Popen(  # noqa: S603 - argv is this Python and our worker module, no shell
                argv,
                env=env,
                cwd=self.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT if log is not None else None,
                start_new_session=True,
                pass_fds=(self._lifeline.read_fd,),
            )
        finally:
            if log is not None:
                log.close()
        slot.process = proc
        self._write_record()
        return proc

    def _write_record(self) -> None:
        """Record the fleet (caller holds the lock); a failure is logged, the fleet keeps running."""
        if self.record is None:
            return
        pids = [s.process.pid for s in self._slots if s.process is not None and s.process.returncode is None]
        try:
            write_record(self.record, self.token, pids)
        except OSError as exc:
            logger.warning("cannot record the workers in %s: %s", self.record, exc)

    def _run_slot(self, slot: _Slot) -> None:
        """Waiter thread of one slot: wait, then restart after backoff or give up."""
        while True:
            proc = slot.process
            if proc is None:
                return
            returncode = proc.wait()
            if self._stopping.is_set():
                return
            # End whatever the dead worker left in its process group (e.g. dramatiq's worker
            # processes) before a replacement starts consuming.
            if _group_members(proc.pid):
                _terminate([proc], self.orphan_grace)
            now = time.monotonic()
            with self._lock:
                slot.crash_times.append(now)
                while slot.crash_times and now - slot.crash_times[0] > self.restart_window:
                    slot.crash_times.popleft()
                crashes = len(slot.crash_times)
                restarts = slot.restarts
            sig = _signal_name(returncode)
            how = f"killed by {sig}" if sig else f"exited with status {returncode}"
            self._emit(SupervisorEvent(
                "exited", slot.index, proc.pid, returncode, sig, restarts,
                f"pid {proc.pid} {how} ({crashes} crash(es) in the last {self.restart_window:g}s)",
            ))  # fmt: skip
            if not self._restart_after_backoff(slot, crashes):
                return

    def _restart_after_backoff(self, slot: _Slot, crashes: int) -> bool:
        """Give up, or wait the backoff and respawn (retrying failed spawns); False = thread ends."""
        while True:
            if crashes > self.max_restarts:
                with self._lock:
                    slot.gave_up = True
                    slot.process = None
                    restarts = slot.restarts
                self._emit(SupervisorEvent(
                    "gave_up", slot.index, None, restarts=restarts,
                    message=(
                        f"giving up on worker {slot.index}: {crashes} crashes within "
                        f"{self.restart_window:g}s (max_restarts={self.max_restarts}); the slot stays down"
                    ),
                ))  # fmt: skip
                return False
            delay = min(self.backoff_initial * (2 ** (crashes - 1)), self.backoff_max)
            if self._stopping.wait(delay):
                return False
            with self._lock:
                if self._stopping.is_set():
                    return False
                try:
                    proc = self._spawn(slot)
                except OSError as exc:
                    spawn_error: OSError | None = exc
                    slot.process = None
                else:
                    spawn_error = None
                    slot.restarts += 1
                restarts = slot.restarts
            if spawn_error is None:
                self._emit(SupervisorEvent(
                    "restarted", slot.index, proc.pid, restarts=restarts,
                    message=f"restarted as pid {proc.pid} after {delay:.2f}s backoff (restart #{restarts})",
                ))  # fmt: skip
                return True
            self._emit(SupervisorEvent(
                "spawn_failed", slot.index, None, restarts=restarts, message=f"cannot start: {spawn_error}",
            ))  # fmt: skip
            now = time.monotonic()
            with self._lock:
                slot.crash_times.append(now)
                while slot.crash_times and now - slot.crash_times[0] > self.restart_window:
                    slot.crash_times.popleft()
                crashes = len(slot.crash_times)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> Supervisor:
        """Spawn every worker and the waiter threads.  A worker that cannot be spawned raises."""
        with self._lock:
            if self._started:
                raise RuntimeError("Supervisor already started")
            self._started = True
            try:
                for slot in self._slots:
                    self._spawn(slot)
            except BaseException:
                self._stopping.set()
                self._stopped = True
                for proc in (s.process for s in self._slots if s.process is not None):
                    _signal_worker(proc, signal.SIGKILL)
                    proc.wait()
                for s in self._slots:
                    s.process = None
                if self._lifeline is not None:
                    self._lifeline.close()
                raise
        for slot in self._slots:
            if slot.process is None:
                raise RuntimeError('internal error: expected slot.process is not None')
            self._emit(
                SupervisorEvent(
                    "started", slot.index, slot.process.pid, message=f"started as pid {slot.process.pid}"
                )
            )
            slot.thread = threading.Thread(
                target=self._run_slot, args=(slot,), name=f"photojobs-supervisor-{slot.index}", daemon=True
            )
            slot.thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every worker, SIGKILL what is left of its process group after ``timeout``.

        Idempotent; no restart happens once stop has begun.  See :func:`_terminate` for why SIGTERM
        goes to each worker's own process rather than to its whole group.
        """
        with self._lock:
            self._stopping.set()
            if self._stopped or not self._started:
                self._stopped = True
                return
            self._stopped = True
            procs = [s.process for s in self._slots if s.process is not None]
        for proc in _terminate(procs, timeout):
            logger.warning("worker process group %d did not stop within %gs; killed it", proc.pid, timeout)
        for proc in procs:
            proc.wait()
        for slot in self._slots:
            if slot.thread is not None and slot.thread is not threading.current_thread():
                slot.thread.join()
        with self._lock:
            for slot in self._slots:
                slot.process = None
            if self._lifeline is not None:
                self._lifeline.close()
            if self.record is not None:
                with contextlib.suppress(OSError):
                    self.record.unlink()

    def __enter__(self) -> Supervisor:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
