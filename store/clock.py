"""The database clock. Every lease and every time comparison uses it, never a worker's clock.

Times are stored as float seconds since the Unix epoch, computed by the database server
(PostgreSQL ``clock_timestamp()``, SQLite ``julianday('now')``) so that workers on hosts with
skewed clocks still agree on who holds a lease.
"""

from __future__ import annotations

from sqlalchemy import Float
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.functions import FunctionElement


class db_now(FunctionElement):  # noqa: N801 - reads like the SQL function it stands for
    """``now()`` as epoch seconds, evaluated by the database."""

    type = Float()
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "postgresql")
def _db_now_pg(element: db_now, compiler: object, **kw: object) -> str:
    return "CAST(extract(epoch from clock_timestamp()) AS double precision)"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: object, **kw: object) -> str:
    return "((julianday('now') - 2440587.5) * 86400.0)"
