"""Plumbing shared by the benchmarks: child processes, a private Redis, fresh databases, temp folders.

Every child process is started in a session of its own (its own process group) and killed as a
group when its benchmark ends or the run stops for any reason (``BenchContext.close`` runs in a
``finally``; ``python -m benchmarks`` turns SIGTERM/SIGHUP into ``SystemExit`` so that happens on
those too). On Linux the direct children also get ``PR_SET_PDEATHSIG`` so they die with the
benchmark process even if it is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypeVar

from photojobs.cli_support import worker_env

from .registry import Row

if TYPE_CHECKING:
    from photojobs.api import Client

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")

DEFAULT_PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"
HEARTBEATS_KEY = "dramatiq:__heartbeats__"
STORES = ("sqlite", "postgresql")


class BenchmarkError(RuntimeError):
    """A benchmark could not complete (a deadline passed, a process died, a store is missing)."""


class StoreUnavailable(BenchmarkError):
    """The requested store (PostgreSQL) cannot be reached; its cases are skipped."""


def failed_row(benchmark: str, case: str, figure: str, exc: BenchmarkError) -> Row:
    """The row of a case that did not complete: ``skipped`` when its store cannot be reached,
    ``error`` (said on stderr too) otherwise."""
    if isinstance(exc, StoreUnavailable):
        return Row(benchmark, case, figure, None, verdict="skipped", note=str(exc))
    print(f"[benchmarks] {benchmark} {case}: {exc}", file=sys.stderr)
    return Row(benchmark, case, figure, None, verdict="error", note=str(exc)[:500])


def wait_for(predicate: Callable[[], T], timeout: float, interval: float = 0.05, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy; raise ``BenchmarkError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchmarkError(f"timed out after {timeout:.0f}s waiting for {what or predicate}")
        time.sleep(interval)


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pdeathsig() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when this process dies (None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return preexec


_PREEXEC = _pdeathsig()


def command_line(cmd: Sequence[str], env: Mapping[str, str] | None = None, keys: Sequence[str] = ()) -> str:
    """``cmd`` as a shell line, prefixed with the ``keys`` of ``env`` it depends on."""
    prefix = " ".join(f"{k}={shlex.quote(env[k])}" for k in keys if env and k in env)
    exe = ["python" if c == sys.executable else c for c in cmd]
    return (prefix + " " if prefix else "") + shlex.join(exe)


def group_members(pgid: int) -> list[int]:
    """Pids of the processes in process group ``pgid`` (from /proc; zombies included)."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                raw = (entry / "stat").read_text()
            except OSError:
                continue
            if int(raw[raw.rindex(")") + 2 :].split()[2]) == pgid:
                out.append(int(entry.name))
    return out


class Processes:
    """Child processes of the run, each in its own process group; ``kill_all`` leaves none behind."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._paths: dict[int, Path] = {}
        self._trees: set[int] = set()
        self._count = 0

    def spawn(self, name: str, cmd: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """Start ``cmd`` (cwd = the repository) with its output in ``<logdir>/<name>-<n>.log``."""
        self._count += 1
        path = self.logdir / f"{name}-{self._count}.log"
        log = open(path, "ab")  # noqa: SIM115 - closed in kill_all
        self._logs.append(log)
        proc = subprocess.Popen(
            list(cmd),
            cwd=ROOT,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_PREEXEC,  # only calls prctl; we spawn from the main thread
        )
        self.procs.append(proc)
        self._paths[proc.pid] = path
        return proc

    def kill(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
        """SIGKILL the process's whole group (resuming it first, were it stopped) and reap the leader.

        The group is killed even when its leader has exited (a dramatiq worker child may outlive it),
        but only while the group id is certainly ours: the leader not yet reaped (its pid cannot be
        reused) or members left in the group. A process whose group is gone is forgotten.
        """
        if proc.pid in self._trees and proc.returncode is None:
            # A supervisor (``photojobs worker``): its workers run in sessions of their own.
            from .cpu import tree

            for pid in tree(proc.pid)[1:]:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    pgid = os.getpgid(pid)
                    if pgid != os.getpgrp():
                        os.killpg(pgid, signal.SIGKILL)
        if proc.returncode is None or group_members(proc.pid):
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired, ChildProcessError):
            proc.wait(timeout=timeout)
        if proc.returncode is not None and not group_members(proc.pid) and proc in self.procs:
            self.procs.remove(proc)

    def kill_all(self) -> None:
        """Kill every process group this run started and close the log files."""
        for proc in list(self.procs):
            self.kill(proc)
        self.procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()

    def tail(self, proc: subprocess.Popen[bytes], chars: int = 2000) -> str:
        """The end of a process's log (for error messages)."""
        path = self._paths.get(proc.pid)
        if path is None or not path.exists():
            return ""
        return path.read_text(errors="replace")[-chars:]


class RedisServer:
    """A private ``redis-server`` on a free loopback port, without persistence."""

    def __init__(self, procs: Processes, workdir: Path) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not Path(binary).exists():
            raise BenchmarkError("redis-server is not installed (apt-get install redis-server)")
        self.binary = binary
        self.procs = procs
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self._client: Any = None

    @property
    def url(self) -> str:
        """The server's ``redis://`` URL."""
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def command(self) -> list[str]:
        """The ``redis-server`` command line: loopback only, no persistence."""
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]

    def client(self) -> Any:
        """A ``redis.Redis`` client of this server."""
        if self._client is None:
            import redis

            self._client = redis.Redis.from_url(self.url)
        return self._client

    def start(self) -> None:
        """Start the server and wait until it answers PING."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = self.procs.spawn("redis", self.command, {**os.environ})

        def pings() -> bool:
            import redis

            try:
                return bool(self.client().ping())
            except redis.ConnectionError:
                return False

        wait_for(pings, 10, what=f"redis-server on port {self.port}")

    def flush(self) -> None:
        """Drop every key (FLUSHALL) so each case starts from an empty Redis."""
        self.client().flushall()

    def worker_ids_since(self, since_ms: float) -> set[bytes]:
        """Dramatiq broker ids that fetched or enqueued since ``since_ms`` (from the heartbeat zset)."""
        return set(self.client().zrangebyscore(HEARTBEATS_KEY, since_ms, "+inf"))

    def stop(self) -> None:
        """Close the client and kill the server."""
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()
            self._client = None
        if self.proc is not None:
            self.procs.kill(self.proc)
            self.proc = None


class Databases:
    """Fresh databases with the photojobs schema: SQLite files in the work dir, PostgreSQL databases
    created from the admin database and dropped afterwards."""

    def __init__(self, workdir: Path, pg_admin: str) -> None:
        self.workdir = workdir
        self.pg_admin = pg_admin
        self.created_pg: list[str] = []
        self._pg_problem: str | None | bool = False  # False = not checked yet

    def pg_problem(self) -> str | None:
        """Why PostgreSQL cannot be used (None when it can)."""
        if self._pg_problem is False:
            import psycopg

            try:
                with psycopg.connect(self.pg_admin, connect_timeout=3):
                    self._pg_problem = None
            except Exception as exc:  # noqa: BLE001 - any failure means: skip PostgreSQL
                self._pg_problem = f"PostgreSQL not reachable at {self.pg_admin}: {exc}"
        return self._pg_problem  # type: ignore[return-value]

    def create(self, store: str, label: str) -> str:
        """A new, empty database of ``store`` at the current schema; returns its URL."""
        from store.engine import make_engine
        from store.schema import upgrade

        tag = uuid.uuid4().hex[:8]
        if store == "sqlite":
            url = f"sqlite:///{self.workdir / f'{label}-{tag}.db'}"
        elif store == "postgresql":
            problem = self.pg_problem()
            if problem:
                raise StoreUnavailable(problem)
            import psycopg

            name = f"pjbench_{label}_{tag}"
            with psycopg.connect(self.pg_admin, autocommit=True) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            self.created_pg.append(name)
            url = self.pg_admin.rsplit("/", 1)[0] + f"/{name}"
        else:
            raise ValueError(f"unknown store {store!r}; stores are {', '.join(STORES)}")
        engine = make_engine(url)
        try:
            upgrade(engine)
        finally:
            engine.dispose()
        return url

    def drop(self, url: str) -> None:
        """Drop a PostgreSQL database made by ``create`` (SQLite files go with the work dir)."""
        name = url.rsplit("/", 1)[-1]
        if name in self.created_pg:
            import psycopg

            with psycopg.connect(self.pg_admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            self.created_pg.remove(name)

    def drop_all(self) -> None:
        """Drop every PostgreSQL database still listed (cleanup after an error)."""
        for name in list(self.created_pg):
            with contextlib.suppress(Exception):
                self.drop(f"/{name}")


@dataclass
class Config:
    """What to run and how big (CLI flags, ``PJBENCH_*`` variables, ``--quick``)."""

    items: int = 2000
    processes: int = 2
    threads: int = 4
    submit_items: int = 100_000
    photos: int = 300  # sample photos in the analysis run
    repetitions: int = 3
    stores: list[str] = field(default_factory=lambda: list(STORES))
    only: list[str] = field(default_factory=list)
    bound: int = 0  # PHOTOJOBS_LANE_NOOP_BOUND; 0 = the runtime's default (2 x threads x processes)
    quick: bool = False
    keep: bool = False
    pg_admin: str = DEFAULT_PG_ADMIN

    @property
    def warmup(self) -> int:
        """Items/messages run before each throughput measurement (connections, imports, caches)."""
        return self.warmup_for(self.items)

    @property
    def heavy_stores(self) -> list[str]:
        """The stores of the longer benchmarks: ``stores``, but only SQLite (else the first) with --quick."""
        if not self.quick:
            return list(self.stores)
        return [s for s in self.stores if s == "sqlite"] or self.stores[:1]

    def warmup_for(self, items: int, threads: int | None = None) -> int:
        """The warm-up size before a measurement of ``items`` with ``threads`` per process."""
        pt = self.processes * (threads or self.threads)
        return max(pt, min(items // 10, 4 * pt))


@dataclass
class Notes:
    """Settings and commands a benchmark reports besides its rows."""

    settings: dict[str, Any] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)


class BenchContext:
    """Everything a benchmark gets: the config, a private Redis, fresh databases, child processes
    (always cleaned up), a work dir for files and logs, and a place to note settings and commands."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.workdir = Path(tempfile.mkdtemp(prefix="pjbench-"))
        self.logdir = self.workdir / "logs"
        self.logdir.mkdir()
        self.procs = Processes(self.logdir)
        self.dbs = Databases(self.workdir, config.pg_admin)
        self.redis = RedisServer(self.procs, self.workdir / "redis")
        self.notes: dict[str, Notes] = {}
        self.current = ""
        self._folders: dict[tuple[str, int], Path] = {}

    # -- lifetime ----------------------------------------------------------------------------
    def open(self) -> BenchContext:
        """Start the private Redis; returns the context."""
        self.redis.start()
        return self

    def end_run(self, procs: Sequence[subprocess.Popen[bytes]], client: Client | None, url: str) -> None:
        """The end of one run on a fresh database: kill its processes, close the client's
        connections, drop the database."""
        for p in procs:
            self.procs.kill(p)
        if client is not None:
            client.engine.dispose()
        self.dbs.drop(url)

    def close(self) -> None:
        """Kill every child process group, drop PostgreSQL databases, remove the work dir."""
        try:
            self.redis.stop()
        finally:
            try:
                self.procs.kill_all()
            finally:
                try:
                    self.dbs.drop_all()
                finally:
                    if not self.config.keep:
                        shutil.rmtree(self.workdir, ignore_errors=True)

    # -- notes -------------------------------------------------------------------------------
    def note(self, *, settings: Mapping[str, Any] | None = None, command: str | None = None) -> None:
        """Record settings / a command line for the running benchmark (shown with its rows)."""
        n = self.notes.setdefault(self.current, Notes())
        if settings:
            n.settings.update(settings)
        if command and command not in n.commands:
            n.commands.append(command)

    # -- photojobs processes -----------------------------------------------------------------
    def photojobs_env(self, database_url: str, **extra: str) -> dict[str, str]:
        """The environment of photojobs workers and sweepers for this run."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOTOJOBS_", "dramatiq_"))}
        env.update(
            {
                "PHOTOJOBS_DATABASE_URL": database_url,
                "PHOTOJOBS_REDIS_URL": self.redis.url,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(extra)
        return env

    def worker_command(
        self, threads: int, queue: str = "photojobs.noop", module: str = "actors"
    ) -> list[str]:
        """A ``dramatiq <module> --processes 1`` worker command on ``queue``."""
        return [
            sys.executable,
            "-m",
            "dramatiq",
            module,
            "--processes",
            "1",
            "--threads",
            str(threads),
            "--queues",
            queue,
        ]

    def start_worker(
        self, env: Mapping[str, str], threads: int, queue: str = "photojobs.noop"
    ) -> subprocess.Popen[bytes]:
        """One ``dramatiq actors --processes 1`` worker on ``queue`` (the noop lane's by default)."""
        # The same worker settings `photojobs worker`/`run` use (prefetch, idle poll interval).
        full = worker_env(threads, {k: v for k, v in env.items() if not k.startswith("dramatiq_")})
        return self.procs.spawn("worker", self.worker_command(threads, queue), full)

    def product_command(self, processes: int, threads: int, lanes: str | None = None) -> list[str]:
        """``photojobs worker --processes P --threads T [--lanes L]``: the fleet as users start it."""
        cmd = [sys.executable, "-m", "photojobs", "worker", "--processes", str(processes)]
        cmd += ["--threads", str(threads)]
        return cmd + (["--lanes", lanes] if lanes else [])

    def start_product(self, env: Mapping[str, str], cmd: Sequence[str]) -> subprocess.Popen[bytes]:
        """Start a ``photojobs worker`` command; killing it kills its workers' process groups too."""
        proc = self.procs.spawn("photojobs-worker", cmd, env)
        self.procs._trees.add(proc.pid)
        return proc

    def start_sweeper(self, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        """``python -m photojobs sweep`` (revokes expired leases and dispatches pending items)."""
        return self.procs.spawn("sweeper", [sys.executable, "-m", "photojobs", "sweep"], env)

    def wait_workers_ready(
        self, procs: Sequence[subprocess.Popen[bytes]], since_ms: float, count: int, timeout: float = 60
    ) -> None:
        """Wait until ``count`` Dramatiq brokers have polled Redis since ``since_ms``."""

        def ready() -> bool:
            for p in procs:
                if p.poll() is not None:
                    raise BenchmarkError(
                        f"worker {shlex.join(p.args)} exited with {p.returncode}:\n{self.procs.tail(p)}"  # type: ignore[arg-type]
                    )
            return len(self.redis.worker_ids_since(since_ms)) >= count

        wait_for(ready, timeout, what=f"{count} worker process(es) to poll Redis")

    # -- files -------------------------------------------------------------------------------
    def folder(self, label: str, n: int, *, empty: bool = True) -> Path:
        """A folder of ``n`` files (cached per label and size)."""
        key = (label, n)
        if key not in self._folders:
            folder = self.workdir / f"{label}-{n}"
            folder.mkdir()
            width = max(6, len(str(n)))
            for i in range(n):
                with open(folder / f"p{i:0{width}d}.jpg", "wb") as f:
                    if not empty:
                        f.write(b"x")
            self._folders[key] = folder
        return self._folders[key]


def now_ms() -> float:
    """The current time in ms, as Dramatiq stamps its heartbeats."""
    return time.time() * 1000
