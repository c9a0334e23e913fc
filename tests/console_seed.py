"""Test support for the console: many finished jobs written set-based (a store with history)."""

from __future__ import annotations

from sqlalchemy import Engine, text
from sqlalchemy.orm import Session


def seed_jobs(engine: Engine, jobs: int, items: int, *, failed_every: int = 500) -> None:
    """``jobs`` jobs of the noop lane with ``items`` items each, all succeeded but for one failed
    item in every ``failed_every``-th job (those are ``partial``). No events, no photos."""
    pg = engine.dialect.name == "postgresql"

    def series(n: str) -> str:
        if pg:
            return f"generate_series(1, {n}) AS g(x)"
        return (
            f"(WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {n}) SELECT x FROM c)"
        )

    lanes, params, roots = (
        ("CAST('[\"noop\"]' AS json)", "CAST('{}' AS json)", "CAST('[]' AS json)")
        if pg
        else ("'[\"noop\"]'", "'{}'", "'[]'")
    )
    with Session(engine) as s, s.begin():
        first = s.execute(text("SELECT coalesce(max(id), 0) FROM jobs")).scalar_one()
        s.execute(
            text(
                "INSERT INTO jobs (lanes, params, roots, fingerprint, created_at, photos, landed, "
                "submitting) "
                f"SELECT {lanes}, {params}, {roots}, 'seed-' || x, 1000.0 + x, 0, 0, false "  # noqa: S608 - literals chosen in code
                f"FROM {series(':jobs')}"
            ),
            {"jobs": jobs},
        )
        s.execute(
            text(
                "INSERT INTO items (job_id, lane, position, photo_id, state, attempt, fencing_token, "  # noqa: S608 - literals chosen in code
                "not_before, updated_at) "
                "SELECT j.id, 'noop', 0, NULL, "
                "CASE WHEN j.id % :every = 0 AND x = 1 THEN 'failed' ELSE 'succeeded' END, 1, 1, 0.0, 2000.0 "
                f"FROM jobs j CROSS JOIN {series(':items')} WHERE j.id > :first"
            ),
            {"items": items, "every": failed_every, "first": first},
        )
    if pg:
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("ANALYZE jobs, items")
