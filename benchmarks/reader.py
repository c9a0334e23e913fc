"""Read-only queries of a photojobs database that do not disturb what they measure.

The runtime's engine (``store.engine.make_engine``) opens every SQLite transaction with
``BEGIN IMMEDIATE``, reads included, so polling through it would take the write lock the workers
queue for. This reader uses a plain ``sqlite3`` connection (deferred, read-only) or ``psycopg``
in autocommit mode instead.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import make_url


class Reader:
    """``rows(sql, params)`` with ``?`` placeholders on either store."""

    def __init__(self, url: str) -> None:
        parsed = make_url(url)
        self.sqlite = parsed.drivername.startswith("sqlite")
        self._conn: Any
        if self.sqlite:
            self._conn = sqlite3.connect(f"file:{parsed.database}?mode=ro", uri=True, timeout=30)
            self._conn.isolation_level = None
        else:
            import psycopg

            plain = parsed.set(drivername="postgresql").render_as_string(hide_password=False)
            self._conn = psycopg.connect(plain, autocommit=True)

    def rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Run one query and return its rows."""
        if not self.sqlite:
            sql = sql.replace("?", "%s")
        return list(self._conn.execute(sql, tuple(params)).fetchall())

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first column of the first row, or None."""
        rows = self.rows(sql, params)
        return rows[0][0] if rows else None

    def states(self, job_id: int) -> dict[str, int]:
        """{state: count} of a job's items."""
        return dict(self.rows("SELECT state, count(*) FROM items WHERE job_id = ? GROUP BY state", (job_id,)))

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
