"""Engine and session setup for SQLite (WAL, busy timeout, foreign keys) and PostgreSQL."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import QueuePool

DEFAULT_SQLITE_NAME = "photojobs.db"
READ_ONLY = "photojobs_read_only"


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


def make_engine(url: str, *, pool_size: int = 10) -> Engine:
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
    # A frozen worker must not hold row locks forever: PostgreSQL ends a transaction left idle
    # for a minute, so the sweeper can revoke the frozen worker's lease.
    engine = create_engine(
        url,
        pool_size=pool_size,
        max_overflow=10,
        pool_pre_ping=True,
        connect_args={"options": "-c idle_in_transaction_session_timeout=60000"},
    )
    if os.environ.get("PHOTOJOBS_LOCKDEP"):  # the test suite's lock-order checker (store/lockdep.py)
        from .lockdep import install

        install(engine, os.environ["PHOTOJOBS_LOCKDEP"])
    return engine


def reader(engine: Engine) -> Engine:
    """The same engine for read-only transactions (SQLite: plain ``BEGIN``, no write lock)."""
    return engine.execution_options(**{READ_ONLY: True})
