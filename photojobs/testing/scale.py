"""Scale tooling: bulk-built tables for benchmarks and tests, and the query plans of the hot paths.

``seed_pending`` writes N pending items (and their photos) with a few set-based statements
(``INSERT … SELECT`` over a generated series) instead of N submissions, so a 1M-item table takes
seconds. ``hot_paths`` names the statements the dispatcher, the sweeper and bundle release run on
every pass or every finished item — the very statement objects the store executes — and
``plan``/``full_scans`` show how the database runs them (``EXPLAIN QUERY PLAN`` on SQLite,
``EXPLAIN`` on PostgreSQL): none may read the whole ``items`` table.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping

from sqlalchemy import Engine, Executable, insert, select, text, update
from sqlalchemy.orm import Session

from store.dispatch import stale_queued_query
from store.items import successors_query, unfinished_in_lane
from store.models import PENDING, QUEUED, SUCCEEDED, WAITING, Item, Job, unindexed_state
from store.statements import mark_queued_sql, next_pending_job_sql, pending_of_job_sql, queued_count_sql
from store.sweeper import expired_leases


def seed_pending(
    engine: Engine, n: int, *, lane: str = "noop", jobs: int = 1, finished: int = 0
) -> list[int]:
    """Write ``n`` pending items of ``lane`` (one photo each, fake paths) spread over ``jobs`` new,
    fully submitted jobs, after ``finished`` succeeded items of one older job (the history a real
    table has, in front of the pending work in job order). Set-based statements in one
    transaction; returns the ids of the jobs with pending items.

    No events are written (this is a load fixture, not a submission). On PostgreSQL the tables are
    ANALYZEd afterwards, as autovacuum would do after such a load.
    """
    pg = engine.dialect.name == "postgresql"
    with Session(engine) as s, s.begin():
        if finished:
            _seed(s, pg, finished, SUCCEEDED, lane, 1)
        job_ids = _seed(s, pg, n, PENDING, lane, jobs)
    if pg:
        with engine.connect() as conn:
            auto = conn.execution_options(isolation_level="AUTOCOMMIT")
            auto.exec_driver_sql("ANALYZE photos, items, jobs")
    return job_ids


def _seed(s: Session, pg: bool, n: int, state: str, lane: str, jobs: int) -> list[int]:
    tag = uuid.uuid4().hex[:8]
    series = (
        "generate_series(1, :n) AS g(x)"
        if pg
        else "(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < :n) SELECT x FROM c)"
    )
    job_ids = [
        s.execute(
            insert(Job)
            .values(
                lanes=[lane],
                params={},
                roots=[],
                fingerprint=f"scale-{tag}-{j}",
                created_at=0.0,
                photos=0,
                landed=0,
            )
            .returning(Job.id)
        ).scalar_one()
        for j in range(jobs)
    ]
    prefix = f"/scale/{tag}/"
    s.execute(
        text(f"INSERT INTO photos (path, size, updated_at) SELECT :prefix || x, 0, 0.0 FROM {series}"),  # noqa: S608 - {series} is a dialect's row generator chosen in code, values are bound
        {"n": n, "prefix": prefix},
    )
    s.execute(
        text(
            "INSERT INTO items (job_id, lane, position, photo_id, state, attempt, fencing_token, "
            "not_before, updated_at) "
            "SELECT :first + (p.id % :jobs), :lane, 0, p.id, :state, 0, 0, 0.0, 0.0 "
            "FROM photos p WHERE p.path >= :lo AND p.path < :hi"
        ),
        {
            "first": job_ids[0],
            "jobs": jobs,
            "lane": lane,
            "state": state,
            "lo": prefix,
            "hi": prefix[:-1] + chr(ord("/") + 1),
        },
    )
    return job_ids


def requeue(engine: Engine, lane: str = "noop") -> int:
    """Queued items of ``lane`` back to pending (a benchmark resets the lane between passes)."""
    with Session(engine) as s, s.begin():
        return s.execute(
            update(Item).where(Item.lane == lane, Item.state == QUEUED).values(state=PENDING, queued_at=None)
        ).rowcount


def hot_paths(dialect: str, lane: str = "noop", job_id: int = 1) -> dict[str, Executable]:
    """The statements run per dispatch, per sweep pass and per finished item, by name (with example
    parameters: a few item / photo ids)."""
    ids = [1, 2, 3]
    return {
        # The dispatcher's prebuilt statements (store.statements), with example parameters.
        "dispatch: next job with pending items": next_pending_job_sql(dialect).bindparams(lane=lane, after=0),
        "dispatch: a job's ready items": pending_of_job_sql(dialect).bindparams(
            lane=lane, job_id=job_id, limit=16
        ),
        "dispatch: queued count": queued_count_sql(dialect).bindparams(lane=lane),
        "dispatch: mark queued": mark_queued_sql(dialect).bindparams(ids=ids),
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
    from sqlalchemy import func

    with Session(engine) as s:
        return s.execute(select(func.count()).select_from(Item)).scalar_one()
