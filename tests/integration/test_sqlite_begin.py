"""SQLite transactions open with ``BEGIN IMMEDIATE`` sent straight to the driver (``store.engine``);
a BEGIN that fails still surfaces as SQLAlchemy's error naming the statement, as every other store
error does (``store.errors`` classifies those), and the engine keeps working afterwards."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import exc, text

from store.engine import make_engine, reader


def test_a_begin_that_cannot_get_the_write_lock_raises_sqlalchemys_error_and_the_engine_recovers(
    tmp_path: Path,
) -> None:
    # Given a SQLite store whose write lock another process holds, and a connection of the
    # runtime's engine that gives up waiting for it after 50 ms
    path = tmp_path / "store.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with engine.connect() as conn:
            conn.connection.driver_connection.execute("PRAGMA busy_timeout=50")  # type: ignore[union-attr]
            # When it begins a write transaction
            with pytest.raises(exc.OperationalError) as raised:
                conn.begin()
            # Then the error is SQLAlchemy's, names the statement, and says why
            assert raised.value.statement == "BEGIN IMMEDIATE"
            assert "locked" in str(raised.value.orig)
            # And a read-only transaction (plain BEGIN, no write lock) still works meanwhile
        with reader(engine).connect() as conn, conn.begin():
            assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 0
    finally:
        blocker.rollback()
        blocker.close()
    # And once the lock is free, the same engine writes again
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO t VALUES (1)"))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM t")).scalar_one() == 1
    engine.dispose()


def test_every_write_transaction_holds_the_write_lock_from_its_start(tmp_path: Path) -> None:
    # Given the runtime's engine on a SQLite store
    path = tmp_path / "store.db"
    engine = make_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    # When a write transaction has begun but not yet written anything
    with engine.begin() as conn:
        conn.execute(text("SELECT 1"))
        # Then another connection cannot take the write lock (BEGIN IMMEDIATE reached SQLite)
        other = sqlite3.connect(path, isolation_level=None, timeout=0.05)
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            other.execute("BEGIN IMMEDIATE")
        other.close()
    engine.dispose()
