"""The query plans of the hot paths: the statements the dispatcher, the sweeper and a finishing item
run on every pass or every finished item, by name, and how the database runs them.

``hot_paths`` names the very statement objects the store executes; ``plan``/``full_scans`` show how
the database runs them (``EXPLAIN QUERY PLAN`` on SQLite, ``EXPLAIN`` on PostgreSQL): none may read
the whole ``items`` table (tests/integration/test_query_plans.py, ``python -m benchmarks scale``;
``photojobs.testing.scale.seed_pending`` builds a table at scale to explain them against).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from sqlalchemy import Engine, Executable, func, select, update
from sqlalchemy.orm import Session

from .dispatch import stale_queued_query
from .models import PENDING, WAITING, Item, unindexed_state
from .queries import (
    RENEW_KEY,
    claim_many_sql,
    mark_queued_sql,
    next_pending_job_sql,
    pending_of_job_sql,
    queued_count_sql,
    succeed_many_sql,
    successors_query,
    unfinished_in_lane,
)
from .sweeper import expired_leases


def hot_paths(dialect: str, lane: str = "noop", job_id: int = 1) -> dict[str, Executable]:
    """The statements run per dispatch, per sweep pass and per finished item, by name (with example
    parameters: a few item / photo ids)."""
    ids = [1, 2, 3]
    keys = [i * RENEW_KEY for i in ids]
    return {
        # The dispatcher's prebuilt statements (store.queries), with example parameters.
        "dispatch: next job with pending items": next_pending_job_sql(dialect).bindparams(lane=lane, after=0),
        "dispatch: a job's ready items": pending_of_job_sql(dialect).bindparams(
            lane=lane, job_id=job_id, limit=16
        ),
        "dispatch: queued count": queued_count_sql(dialect).bindparams(lane=lane),
        "dispatch: mark queued": mark_queued_sql(dialect).bindparams(ids=ids),
        "claim: a batch message's items": claim_many_sql(dialect).bindparams(
            ids=ids, keys=keys, lane=lane, worker="w", ttl=10.0
        ),
        "finish: a batch's plain successes": succeed_many_sql(dialect).bindparams(
            ids=ids, keys=keys, result=None
        ),
        "sweep: expired leases": expired_leases(500),
        "sweep: stale queued items": stale_queued_query(2.0, 1000),
        "finish: next lane's items of the photos": successors_query(job_id, 0, ids),
        "finish: make them ready": update(Item)
        .where(Item.id.in_(ids), unindexed_state(WAITING))
        .values(state=PENDING),
        "bundle release: lane before unfinished?": unfinished_in_lane(job_id, lane, PENDING, dialect),
    }


def legacy_dispatch_scan(lane: str = "noop") -> Executable:
    """The dispatcher's job query before migration 0004 (``DISTINCT job_id`` over every pending
    item of the lane), kept to show in the benchmark what the seek replaced."""
    return (
        select(Item.job_id).where(Item.lane == lane, Item.state == PENDING).distinct().order_by(Item.job_id)
    )


def run_statement(engine: Engine, statement: Executable) -> int:
    """Run a read statement to the end; returns its row count (timing it is the caller's business)."""
    with Session(engine) as s:
        return len(s.execute(statement).all())


def plan(engine: Engine, statement: Executable) -> list[str]:
    """The database's plan for ``statement`` (literal parameters), one line per node."""
    sql = str(statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))  # type: ignore[attr-defined]
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            return [r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql)]
        return [r[3] for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + sql)]


_PG_SCAN = re.compile(r"(Seq Scan|Index Only Scan|Index Scan|Bitmap Heap Scan)(?: using \S+)? on (\w+)")


def full_scans(lines: list[str], table: str = "items") -> list[str]:
    """The plan nodes that read all of ``table`` (or all of one of its indexes).

    SQLite: any ``SCAN table`` (with or without an index: a covering-index scan still reads every
    entry); only ``SEARCH`` is a bounded look-up. PostgreSQL: a ``Seq Scan``, or an index scan
    without an ``Index Cond`` (walking a whole index)."""
    bad = []
    for i, line in enumerate(lines):
        stripped = line.strip().lstrip("-> ").strip()
        if re.match(rf"SCAN {table}\b", stripped):
            bad.append(stripped)
            continue
        m = _PG_SCAN.search(line)
        if not m or m.group(2) != table:
            continue
        if m.group(1) == "Seq Scan":
            bad.append(stripped)
            continue
        if m.group(1) == "Bitmap Heap Scan":
            continue  # its Bitmap Index Scan child carries the condition (checked on its own line)
        depth = len(line) - len(line.lstrip())
        conds = []
        for nxt in lines[i + 1 :]:
            if "->" in nxt and len(nxt) - len(nxt.lstrip()) <= depth + 6:
                break
            conds.append(nxt)
        if not any("Index Cond" in c for c in conds):
            bad.append(stripped)
    return bad


def hot_path_plans(engine: Engine, lane: str = "noop", job_id: int = 1) -> Mapping[str, list[str]]:
    """``plan`` of every statement of ``hot_paths``."""
    return {name: plan(engine, stmt) for name, stmt in hot_paths(engine.dialect.name, lane, job_id).items()}


def count_items(engine: Engine) -> int:
    """How many items the store holds (a benchmark's sanity check)."""
    with Session(engine) as s:
        return s.execute(select(func.count()).select_from(Item)).scalar_one()
