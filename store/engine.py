"""Engine and session setup for SQLite (WAL, busy timeout, foreign keys) and PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

from .errors import ConfigError

DEFAULT_SQLITE_NAME = "photojobs.db"
READ_ONLY = "photojobs_read_only"
#: execution option: the lock wait bound (seconds) of a transaction (``with_lock_timeout``)
LOCK_TIMEOUT = "photojobs_lock_timeout"
SQLITE_BUSY_MS = 30000  # every other SQLite transaction waits up to 30 s for the write lock
IDLE_TIMEOUT_ENV = "PHOTOJOBS_IDLE_TRANSACTION_TIMEOUT"
DEFAULT_LEASE_TTL = 10.0
IDLE_FLOOR = 2.0  # a transaction idle this long (no statement sent) is a frozen or lost client
IDLE_CEILING = 60.0
IDLE_SHARE = 0.8  # of the shortest lease TTL


def database_url(state_dir: Path | None = None) -> str:
    """``PHOTOJOBS_DATABASE_URL``, else a SQLite file in ``state_dir`` (default: the working dir)."""
    url = os.environ.get("PHOTOJOBS_DATABASE_URL")
    if url:
        return url
    folder = Path(state_dir) if state_dir is not None else Path.cwd()
    return f"sqlite:///{(folder / DEFAULT_SQLITE_NAME).resolve()}"


def normalise_url(url: str) -> str:
    """Use psycopg 3 for ``postgresql://`` URLs."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def shortest_lease_ttl(env: Mapping[str, str] | None = None) -> float:
    """The shortest lease TTL the environment configures (``PHOTOJOBS_LEASE_TTL`` and every
    ``PHOTOJOBS_LANE_<LANE>_LEASE_TTL``; 10 s when none is set or none parses)."""
    env = os.environ if env is None else env
    ttls = []
    for key, value in env.items():
        if key == "PHOTOJOBS_LEASE_TTL" or (key.startswith("PHOTOJOBS_LANE_") and key.endswith("_LEASE_TTL")):
            try:
                ttl = float(value)
            except ValueError:
                continue  # the lane settings refuse it, naming the variable (photojobs.config)
            if ttl > 0:
                ttls.append(ttl)
    return min(ttls, default=DEFAULT_LEASE_TTL)


def idle_transaction_timeout(env: Mapping[str, str] | None = None) -> float:
    """Seconds after which PostgreSQL ends a transaction left idle (no statement sent): a frozen
    worker (SIGSTOP, a debugger) must not hold its row locks past its lease, so a ``cancel``, the
    sweeper and claims waiting for them go on within the lease TTL (issue 39). Four fifths of the
    shortest lease TTL, at least 2 s and at most 60 s; ``PHOTOJOBS_IDLE_TRANSACTION_TIMEOUT``
    overrides. Not less: a client starved of CPU for that long inside a legitimate transaction
    loses it (an integration run at load 25 lost one at 5 s with 10 s leases); one stalled past
    its TTL has lost its lease anyway."""
    env = os.environ if env is None else env
    explicit = env.get(IDLE_TIMEOUT_ENV)
    if explicit:
        try:
            value = float(explicit)
        except ValueError:
            raise ConfigError(IDLE_TIMEOUT_ENV, f"{explicit!r} is not a number of seconds") from None
        if not value > 0:
            raise ConfigError(IDLE_TIMEOUT_ENV, f"{value:g} s must be positive")
        return value
    return min(IDLE_CEILING, max(IDLE_FLOOR, shortest_lease_ttl(env) * IDLE_SHARE))


def control_lock_timeout(env: Mapping[str, str] | None = None) -> float:
    """How long a control path (cancel, pause, resume, the sweeper's revocation) waits for one
    lock before it gives up and says so: half the shortest lease TTL, at least 1 s and at most
    4 s, so a waiter is never held past a lease by a holder that has stopped."""
    return lock_timeout_for(shortest_lease_ttl(env))


def lock_timeout_for(ttl: float) -> float:
    """A control path's lock timeout under leases of ``ttl`` seconds: half of it, within [1, 4] s."""
    return min(4.0, max(1.0, ttl / 2))


def with_lock_timeout(engine: Engine, seconds: float) -> Engine:
    """``engine`` whose transactions wait at most ``seconds`` for a lock: PostgreSQL ``SET LOCAL
    lock_timeout`` (an error with SQLSTATE 55P03, ``LockNotAvailable``, when it passes), SQLite
    the busy timeout of its ``BEGIN IMMEDIATE`` (``database is locked``)."""
    if not seconds > 0:
        raise ValueError(f"a lock timeout must be positive, not {seconds!r}")
    return engine.execution_options(**{LOCK_TIMEOUT: float(seconds)})


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait that ran out (``with_lock_timeout``) on either store."""
    orig = getattr(exc, "orig", None)
    if orig is None:
        return False
    if str(getattr(orig, "sqlstate", "") or "") == "55P03":
        return True
    return isinstance(orig, sqlite3.OperationalError) and "locked" in str(orig).lower()


def make_engine(url: str, *, pool_size: int = 10, lease_holder: bool = False) -> Engine:
    """An engine with the settings the protocol relies on.

    SQLite: WAL journal, ``synchronous=NORMAL``, a 30 s busy timeout, foreign keys on, and every
    transaction opened with ``BEGIN IMMEDIATE`` so that a read-then-write transaction holds the
    write lock from its start (the SQLite equivalent of ``SELECT … FOR UPDATE``; no upgrade deadlocks).
    PostgreSQL: psycopg 3, READ COMMITTED, row locks taken explicitly by the store.
    """
    url = normalise_url(url)
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        # A pool, so each transaction does not pay for a new connection, its PRAGMAs and (when it
        # was the last connection) a WAL checkpoint.
        engine = create_engine(
            url,
            poolclass=QueuePool,
            pool_size=pool_size,
            max_overflow=20,
            connect_args={"timeout": 30, "check_same_thread": False},
        )

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:  # type: ignore[no-untyped-def]
            # Read-only work (status, event reads) through ``reader(engine)`` does not take the write lock.
            read_only = conn.get_execution_options().get(READ_ONLY, False)
            begin = "BEGIN" if read_only else "BEGIN IMMEDIATE"
            _sqlite_busy_timeout(conn)
            try:
                # Straight to the driver: SQLAlchemy's statement machinery cost ~0.1 ms of CPU per
                # BEGIN, ~10 % of a no-op item's store work (README, Benchmarks), for a statement
                # that has no parameters and no result.
                conn.connection.driver_connection.execute(begin)
            except sqlite3.Error:
                # Again through SQLAlchemy, for its error (OperationalError naming the statement)
                # and its handling of a lost connection.
                conn.exec_driver_sql(begin)

        return engine
    # A frozen worker must not hold row locks past its lease: in a process that holds leases (a
    # worker: ``lease_holder``), PostgreSQL ends a transaction left idle for 4/5 of the shortest
    # lease TTL (``idle_transaction_timeout``), so a cancel or the sweeper waiting for one of its
    # locks goes on within the TTL (issue 39). Its transactions are short SQL (no file work inside).
    # Every other client (the CLI, the API, a sweeper, a submitter: transactions that may plan over
    # files between statements under load) keeps a minute, as before: a CI run under load saw an
    # undo's submission lose its transaction at 2 s.
    idle = idle_transaction_timeout() if lease_holder else IDLE_CEILING
    idle_ms = max(1, int(idle * 1000))
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=10,
        pool_pre_ping=True,
        connect_args={"options": f"-c idle_in_transaction_session_timeout={idle_ms}"},
    )

    @event.listens_for(engine, "begin")
    def _pg_begin(conn) -> None:  # type: ignore[no-untyped-def]
        seconds = conn.get_execution_options().get(LOCK_TIMEOUT)
        if seconds is not None:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, int(seconds * 1000))}")

    if os.environ.get("PHOTOJOBS_LOCKDEP"):  # the test suite's lock-order checker (store/lockdep.py)
        from .lockdep import install

        install(engine, os.environ["PHOTOJOBS_LOCKDEP"])
    return engine


def _sqlite_busy_timeout(conn) -> None:  # type: ignore[no-untyped-def]
    """The busy timeout of the transaction about to begin on ``conn``: its ``LOCK_TIMEOUT``
    option's, else the 30 s default; a PRAGMA only when it differs from the connection's now."""
    seconds = conn.get_execution_options().get(LOCK_TIMEOUT)
    wanted = SQLITE_BUSY_MS if seconds is None else max(1, int(seconds * 1000))
    info = conn.connection.info
    if info.get("busy_ms", SQLITE_BUSY_MS) != wanted:
        conn.connection.driver_connection.execute(f"PRAGMA busy_timeout={wanted}")
        info["busy_ms"] = wanted


def reader(engine: Engine) -> Engine:
    """The same engine for read-only transactions (SQLite: plain ``BEGIN``, no write lock)."""
    return engine.execution_options(**{READ_ONLY: True})
