"""A store at scale for your own tests and benchmarks: N pending items written in seconds.

``seed_pending`` writes N pending items (and their photos) with a few set-based statements
(``INSERT … SELECT`` over a generated series) instead of N submissions, so a 1M-item table takes
seconds; ``requeue`` resets a lane between benchmark passes. The plans of the hot-path statements
against such a table are ``store.plans`` (re-exported here: ``hot_paths``, ``plan``, ``full_scans``,
``hot_path_plans``, ``legacy_dispatch_scan``, ``run_statement``, ``count_items``).

A load fixture, not a product path: its bulk inserts are the only SQL outside ``store/``.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Engine, insert, text, update
from sqlalchemy.orm import Session

from store.models import PENDING, QUEUED, SUCCEEDED, Item, Job
from store.plans import (
    count_items,
    full_scans,
    hot_path_plans,
    hot_paths,
    legacy_dispatch_scan,
    plan,
    run_statement,
)

__all__ = [
    "count_items",
    "full_scans",
    "hot_path_plans",
    "hot_paths",
    "legacy_dispatch_scan",
    "plan",
    "requeue",
    "run_statement",
    "seed_pending",
]


def seed_pending(
    engine: Engine, n: int, *, lane: str = "noop", jobs: int = 1, finished: int = 0, analyze: bool = True
) -> list[int]:
    """Write ``n`` pending items of ``lane`` (one photo each, fake paths) spread over ``jobs`` new,
    fully submitted jobs, after ``finished`` succeeded items of one older job (the history a real
    table has, in front of the pending work in job order). Set-based statements in one
    transaction; returns the ids of the jobs with pending items.

    No events are written (this is a load fixture, not a submission). On PostgreSQL the tables are
    ANALYZEd afterwards, as autovacuum would do after such a load (``analyze`` False: not, as in a
    big job's first minute).
    """
    pg = engine.dialect.name == "postgresql"
    with Session(engine) as s, s.begin():
        if finished:
            _seed(s, pg, finished, SUCCEEDED, lane, 1)
        job_ids = _seed(s, pg, n, PENDING, lane, jobs)
    if pg and analyze:
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
