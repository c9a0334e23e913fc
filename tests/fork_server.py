"""A fork server for the suite's ``python -m MODULE`` processes: workers, sweepers, servers, CLI.

Each such process used to start a fresh interpreter and import SQLAlchemy, Redis, Pillow, botocore,
FastAPI and pydantic again: ~0.5 s of CPU for a sweeper or a worker and ~1.1 s for ``serve``, ~500
times a run — a fifth of the suite's CPU on two cores (process accounting of a whole ``make test``,
docs/benchmarks.md). Here one server per pytest process imports those libraries once and forks a
child per launch; the child takes the launch's environment, working folder, standard streams and
session before it imports anything of ours (``actors``, ``store``, ``photojobs``: nothing of the
project is imported by the server, so every module reads the child's environment as a fresh
process would), then runs the module as ``python -m`` does and exits with its status.

What the server preloads reads no environment at import: Dramatiq (``dramatiq.worker`` reads its
prefetch and timeout from the environment at import) and prometheus_client (its multiprocess mode)
are left to the child. A launch whose interpreter settings differ (another executable, ``-c``,
``PYTHONHASHSEED``, ``PYTHONDEVMODE``, ...) or ``PHOTOJOBS_TEST_FORK=0`` starts a real process.

The caller gets a :class:`Forked` handle that answers like ``subprocess.Popen``: ``pid`` (the
child's, a session leader when asked: ``os.killpg`` works), ``poll``, ``wait``, ``returncode``
(negative: the signal), ``send_signal``, ``terminate``, ``kill``. The server reaps the child and
sends its status over the launch's connection.
"""

from __future__ import annotations

import atexit
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import psutil

# Libraries the project's processes import that read no environment at import time.
PRELOAD = (
    "sqlalchemy",
    "sqlalchemy.orm",
    "sqlalchemy.dialects.sqlite",
    "sqlalchemy.dialects.postgresql",
    "sqlalchemy.dialects.postgresql.psycopg",
    "psycopg",
    "redis",
    "redis.asyncio",
    "PIL.Image",
    "PIL.ImageOps",
    "pillow_heif",
    "botocore.session",
    "boto3",
    "cryptography.hazmat.primitives.hashes",
    "click",
    "psutil",
    "pydantic",
    "fastapi",
    "starlette.applications",
    "anyio",
    "uvicorn",
    "httpx",
    "typing_extensions",
    "packaging.version",
)
# Environment variables the interpreter reads at start-up: a launch that sets one differently from
# the server starts a real process.
INTERPRETER_VARS = (
    "PYTHONHASHSEED",
    "PYTHONDEVMODE",
    "PYTHONWARNINGS",
    "PYTHONTRACEMALLOC",
    "PYTHONFAULTHANDLER",
    "PYTHONIOENCODING",
    "PYTHONUTF8",
    "PYTHONOPTIMIZE",
    "PYTHONSAFEPATH",
    "PYTHONNOUSERSITE",
    "PYTHONHOME",
    "PYTHONPLATLIBDIR",
    "PYTHONINSPECT",
    "PYTHONSTARTUP",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
)
DISABLE = "PHOTOJOBS_TEST_FORK"


# -- the server -----------------------------------------------------------------------------------


def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001, S112 - a library this machine lacks is imported by the child
            continue


def _reset_signals() -> None:
    signal.set_wakeup_fd(-1)
    for sig in (
        signal.SIGCHLD,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
    ):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # as the interpreter sets it at start-up


def _streams(unbuffered: bool) -> None:
    def text(fd: int, mode: str) -> IO[str]:
        raw = io.FileIO(fd, mode, closefd=False)
        if mode == "r":
            return io.TextIOWrapper(io.BufferedReader(raw), encoding="utf-8", errors="surrogateescape")
        return io.TextIOWrapper(
            io.BufferedWriter(raw),
            encoding="utf-8",
            errors="backslashreplace" if fd == 2 else "surrogateescape",
            line_buffering=fd == 2 or unbuffered,
            write_through=unbuffered,
        )

    sys.stdin, sys.stdout, sys.stderr = text(0, "r"), text(1, "w"), text(2, "w")
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr


def _exit_code(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """Become the launched process (never returns)."""
    code = 1
    try:
        if request["new_session"]:
            os.setsid()
        _reset_signals()
        for target, fd in zip((0, 1, 2), fds, strict=True):
            os.dup2(fd, target)
        os.closerange(3, 1 << 16)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _streams(bool(os.environ.get("PYTHONUNBUFFERED")))
        extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:1] = [os.getcwd(), *(os.path.abspath(p) for p in extra)]
        module, args = request["module"], request["args"]
        sys.argv = [module, *args]
        import runpy

        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exit_:
            code = _exit_code(exit_.code)
        except KeyboardInterrupt:
            traceback.print_exc()
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - printed as the interpreter would, status 1
            traceback.print_exc()
            code = 1
        threading._shutdown()  # type: ignore[attr-defined] # the interpreter waits for its threads
        atexit._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except Exception:  # noqa: BLE001, S110 - a closed stream has nothing left to say
            pass
        if code < 0:  # died of a signal, as a real interpreter does on an unhandled Ctrl-C
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        os._exit(code)


def _recv_request(conn: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, got, _flags, _addr = socket.recv_fds(conn, 1 << 20, 3)
        fds += got
        if not chunk:
            return None
        data += chunk
    return json.loads(data), fds


def serve(path: str) -> None:
    """Listen on the unix socket ``path`` until standard input closes (the pytest process ended)."""
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C of pytest: the server ends with its stdin
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while True:
        for key, _ in sel.select(timeout=1.0):
            if key.data == "accept":
                conn, _addr = listener.accept()
                request = _recv_request(conn)
                if request is None:
                    conn.close()
                    continue
                body, fds = request
                started_r, started_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    os.close(started_r)
                    _child(body, fds)  # closes started_w once in its session with its streams
                os.close(started_w)
                # Answer once the child is its own session (Popen returns after the child's setsid
                # and exec): a killpg of the pid at once must find its group (it did not: the
                # shared fleet's SIGSTOP of a worker just started, ProcessLookupError)
                os.read(started_r, 1)
                os.close(started_r)
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                children[pid] = conn
            elif key.data == "wake":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
            elif key.data == "parent" and not os.read(sys.stdin.fileno(), 4096):
                return
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None:
                try:
                    conn.sendall(json.dumps({"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass
                conn.close()


# -- the client -----------------------------------------------------------------------------------


class Forked:
    """A process the fork server started, answering like ``subprocess.Popen``."""

    def __init__(self, conn: socket.socket, pid: int, args: Sequence[str]) -> None:
        self._conn = conn
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None
        self._reading = threading.Lock()
        self._buffer = b""
        self.stdout = self.stderr = self.stdin = None

    def _read(self, timeout: float | None) -> None:
        # One reader at a time (Popen's wait has its lock too): a harness thread polling while the
        # main thread waits would recv on the socket the other just closed (EBADF, a chaos run)
        if not self._reading.acquire(timeout=-1 if timeout is None else timeout):
            return
        try:
            self._read_locked(timeout)
        finally:
            self._reading.release()

    def _read_locked(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            self._conn.settimeout(left)
            try:
                chunk = self._conn.recv(4096)
            except (TimeoutError, BlockingIOError):
                return
            if not chunk:  # the server went away: the child's status is lost (255 once it is gone)
                if psutil.pid_exists(self.pid):
                    time.sleep(min(0.05, left if left is not None else 0.05))
                    if deadline is not None and time.monotonic() >= deadline:
                        return
                    continue
                self.returncode = 255
                return
            self._buffer += chunk
            if b"\n" in self._buffer:
                self.returncode = int(json.loads(self._buffer.split(b"\n", 1)[0])["exit"])
                self._conn.close()

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        try:
            self._conn.close()
        except Exception:  # noqa: BLE001, S110 - interpreter shutdown
            pass


class _Server:
    """This pytest process's fork server (started on first use, ends when this process does)."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="pj-fork-")
        self.path = os.path.join(self.folder, "s")
        self.env = dict(os.environ)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fork_server", self.path],
            cwd=Path(__file__).resolve().parent.parent,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=self.env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"tests.fork_server did not start: {line!r}")

    def usable(self) -> bool:
        return self.proc.poll() is None

    def launch(
        self,
        module: str,
        args: Sequence[str],
        env: Mapping[str, str],
        cwd: str | os.PathLike[str],
        stdin: int,
        stdout: int,
        stderr: int,
        new_session: bool,
    ) -> Forked:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(self.path)
        body = {
            "module": module,
            "args": list(args),
            "env": dict(env),
            "cwd": os.fspath(cwd),
            "new_session": new_session,
        }
        socket.send_fds(conn, [json.dumps(body).encode() + b"\n"], [stdin, stdout, stderr])
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = conn.recv(4096)
            if not chunk:
                raise RuntimeError("tests.fork_server closed the connection before the child started")
            reply += chunk
        return Forked(conn, int(json.loads(reply)["pid"]), [sys.executable, "-m", module, *args])


_server: _Server | None = None
_lock = threading.Lock()


def _forkable(argv: Sequence[str], env: Mapping[str, str]) -> bool:
    if os.environ.get(DISABLE) == "0" or env.get(DISABLE) == "0":
        return False
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-m":
        return False
    base = _server.env if _server is not None else os.environ
    return all(env.get(k) == base.get(k) for k in INTERPRETER_VARS)


def _get_server() -> _Server:
    global _server
    with _lock:
        if _server is None or not _server.usable():
            _server = _Server()
        return _server


def popen(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: str | os.PathLike[str],
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    start_new_session: bool = False,
) -> Forked | subprocess.Popen[bytes]:
    """``subprocess.Popen(argv, ...)`` through the fork server when ``argv`` is ``python -m MODULE``
    (``stdout``/``stderr``: open files or descriptors; None: this process's), else a real Popen."""
    if not _forkable(argv, env) or subprocess.PIPE in (stdout, stderr):  # pipes: a real process
        return subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdout=stdout,
            stderr=stderr,
            start_new_session=start_new_session,
        )

    with open(os.devnull, "r+b") as devnull:

        def fd(stream: IO[Any] | int | None, default: int) -> int:
            if stream is None:
                return default
            if stream == subprocess.DEVNULL:
                return devnull.fileno()
            return stream if isinstance(stream, int) else stream.fileno()

        return _get_server().launch(
            argv[2],
            argv[3:],
            env,
            cwd,
            devnull.fileno(),
            fd(stdout, 1),
            fd(stderr, 2) if stderr != subprocess.STDOUT else fd(stdout, 1),
            start_new_session,
        )


def run(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | os.PathLike[str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, capture_output=True, text=True, timeout=...)`` through the fork server
    (a real process when it cannot be forked): the status and both outputs as text."""
    if not _forkable(argv, env):
        return subprocess.run(
            list(argv), cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout
        )
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = popen(argv, env=env, cwd=cwd, stdout=out, stderr=err)
        try:
            code = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise
        out.seek(0)
        err.seek(0)

        def text(f: IO[bytes]) -> str:
            return f.read().decode(errors="replace").replace("\r\n", "\n")

        return subprocess.CompletedProcess(list(argv), code, text(out), text(err))


if __name__ == "__main__":
    serve(sys.argv[1])
