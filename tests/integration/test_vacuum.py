"""The sweeper vacuums photojobs' hot tables when the server's autovacuum leaves them alone
(``store.vacuum``, ``photojobs.maintenance.duties.VacuumTables``): real PostgreSQL, real dead rows,
the server's own statistics; SQLite has nothing to vacuum."""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from sqlalchemy import Engine, text, update
from sqlalchemy.orm import Session

from photojobs.maintenance.duties import VacuumTables
from store import jobs as store_jobs
from store.engine import make_engine
from store.lanes import lane_spec
from store.models import Item
from store.vacuum import MIN_DEAD, VACUUM_LOCK_BASE, tables_due, vacuum_table
from tests.support import photo_inputs, wait_for

NOOP = lane_spec("noop", env={})


def dead_item_rows(engine: Engine, tmp_path: Path, n: int) -> None:
    """A job of ``n`` items, each updated twice (two dead versions an item), with autovacuum off for
    ``items`` (whatever the server's setting); the backends' statistics flushed (connections closed)."""
    store_jobs.submit(engine, [NOOP], photo_inputs(tmp_path, n))
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE items SET (autovacuum_enabled = false)")
    for _ in range(2):
        with Session(engine) as s, s.begin():
            s.execute(update(Item).values(updated_at=Item.updated_at + 1))
    engine.dispose()  # a backend's pending statistics are flushed when it exits


def table_stats(engine: Engine, table: str) -> tuple[int, int]:
    """(manual vacuums, dead rows) of ``table`` in the server's statistics."""
    with engine.connect() as conn:
        row = conn.execute(
            text("SELECT vacuum_count, n_dead_tup FROM pg_stat_user_tables WHERE relname = :t"), {"t": table}
        ).one()
    return int(row[0]), int(row[1])


def test_a_table_autovacuum_leaves_alone_is_vacuumed_once_its_dead_rows_pass_the_threshold(
    engine: Engine, db_url: str, tmp_path: Path
) -> None:
    # Given items with twice their count in dead rows, past the threshold, and autovacuum off for them
    n = MIN_DEAD // 2 + 500
    dead_item_rows(engine, tmp_path, n)
    if engine.dialect.name != "postgresql":
        # (SQLite removes an old row version in place: nothing is ever due there)
        assert tables_due(engine) == []
        return
    wait_for(lambda: any(d.table == "items" for d in tables_due(engine)), 30, what="items to be due")
    vacuums, dead = table_stats(engine, "items")
    assert dead >= MIN_DEAD
    events_before = table_stats(engine, "events")[0]
    # When the sweeper's vacuum duty checks (its vacuum runs in a thread of its own)
    duty = VacuumTables(engine)
    duty.run_once()
    assert duty.wait_idle(120), "the vacuum thread ended"
    # Then items was vacuumed once (the server counts it), its dead rows are gone, and the events
    # table, under its threshold, was left alone
    assert [t for t, _ in duty.last] == ["items"]
    fresh = make_engine(db_url)
    try:
        counted = lambda: table_stats(fresh, "items")[0] == vacuums + 1  # noqa: E731
        wait_for(counted, 30, what="the server to count the vacuum")
        assert table_stats(fresh, "items")[1] < MIN_DEAD
        assert table_stats(fresh, "events")[0] == events_before
        assert tables_due(fresh) == []
        # And the next check reports it, and starts nothing more
        assert duty.run_once() == {"vacuumed": 1}
        assert duty.wait_idle(5) and duty.run_once() == {"vacuumed": 0}
    finally:
        fresh.dispose()


def test_a_table_another_sweeper_is_vacuuming_is_left_to_it(engine: Engine) -> None:
    if engine.dialect.name != "postgresql":
        return  # PostgreSQL's vacuum lock (SQLite: nothing to vacuum)
    # Given another sweeper holding the vacuum lock of items
    key = VACUUM_LOCK_BASE + zlib.crc32(b"items")
    with engine.connect() as other:
        assert other.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar_one()
        try:
            # When this sweeper vacuums items, Then it does not (and says so), and events it does
            assert vacuum_table(engine, "items") is None
            assert isinstance(vacuum_table(engine, "events"), float)
        finally:
            other.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            other.commit()
    # And once that sweeper is done, items is vacuumed here again
    assert isinstance(vacuum_table(engine, "items"), float)


def test_only_photojobs_hot_tables_are_ever_named_to_vacuum(engine: Engine) -> None:
    # Given a table name that is not one of the hot tables (the name is spliced into VACUUM)
    for bad in ("photos; DROP TABLE jobs", "alembic_version"):
        with pytest.raises(ValueError, match="hot tables"):
            vacuum_table(engine, bad)
