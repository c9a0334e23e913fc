"""Vacuuming photojobs' hot tables when the server does not (PostgreSQL only).

Every item passes through four or five row versions (pending, queued, running, succeeded; each a
new version, the old one dead) and every event through two (inserted, then numbered). PostgreSQL's
autovacuum removes those dead versions and their index entries; on a server whose ``autovacuum`` is
off (some CI and managed servers ship so), or on a table where it is disabled, nothing does, and
every index range the dispatcher and the event numbering start from the oldest end of -- the lane's
pending items of a job, the next job with pending items, the unnumbered events -- walks over every
dead entry the job has left behind: a million-item job ran its last tenth at half its first tenth's
rate, and ``VACUUM items`` at 80 % doubled the rate at once (docs/benchmarks.md, "The million
row").

:func:`tables_due` names the tables autovacuum leaves alone whose dead rows passed autovacuum's own
default threshold (50 + 20 % of the live rows, at least :data:`MIN_DEAD`); :func:`vacuum_table`
runs ``VACUUM (ANALYZE)`` on one of them, on its own autocommit connection, unless another sweeper
holds the table's vacuum lock. Where autovacuum runs, both leave the tables to it. SQLite removes
a row's old version and its index entries in place: nothing to do there.
"""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

from sqlalchemy import Engine, text

#: photojobs' tables that churn: the only tables :func:`vacuum_table` is ever given.
HOT_TABLES = ("items", "events", "photo_locks", "jobs", "intents", "workers")

#: Fewer dead rows than this are never worth a vacuum of their own.
MIN_DEAD = 10_000

#: autovacuum's own default scale factor: vacuum once the dead rows pass this share of the live ones.
DEAD_SHARE = 0.2

VACUUM_LOCK_BASE = 0x76616300000  # "vac" + the table's crc

_DUE = text(
    """
    SELECT s.relname, s.n_live_tup, s.n_dead_tup
    FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
    WHERE s.schemaname = current_schema() AND s.relname = ANY(:tables)
      AND (current_setting('autovacuum') = 'off'
           OR coalesce('autovacuum_enabled=false' = ANY(c.reloptions), false))
      AND s.n_dead_tup >= greatest(:min_dead, 50 + :share * s.n_live_tup)
    ORDER BY s.n_dead_tup DESC
    """
)


@dataclass(frozen=True)
class Due:
    table: str
    live: int
    dead: int


def tables_due(engine: Engine, *, min_dead: int = MIN_DEAD, share: float = DEAD_SHARE) -> list[Due]:
    """The hot tables autovacuum leaves alone (off on the server, or disabled on the table) whose
    dead rows passed ``max(min_dead, 50 + share * live)``, most dead first; none on SQLite. The
    counts are the server's statistics (``pg_stat_user_tables``: up to a second behind)."""
    if engine.dialect.name != "postgresql":
        return []
    with engine.connect() as conn:
        rows = conn.execute(_DUE, {"tables": list(HOT_TABLES), "min_dead": min_dead, "share": share})
        return [Due(r.relname, int(r.n_live_tup), int(r.n_dead_tup)) for r in rows]


def vacuum_table(engine: Engine, table: str) -> float | None:
    """``VACUUM (ANALYZE) table`` on an autocommit connection of its own; its seconds, or None when
    another sweeper holds the table's vacuum lock (it is vacuuming it). ``table`` must be one of
    :data:`HOT_TABLES` (the name is spliced into the statement)."""
    if table not in HOT_TABLES:
        raise ValueError(f"{table!r} is not one of photojobs' hot tables {HOT_TABLES}")
    key = VACUUM_LOCK_BASE + zlib.crc32(table.encode())
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        if not auto.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar_one():
            return None
        try:
            start = time.monotonic()
            auto.exec_driver_sql(f"VACUUM (ANALYZE) {table}")
            return time.monotonic() - start
        finally:
            auto.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
