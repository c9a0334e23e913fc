"""Migration 0004 on a store that already holds work: nothing is lost, old jobs count as submitted."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text

from store import jobs as store_jobs
from store.engine import make_engine
from store.schema import current_revision, upgrade
from tests.conftest import PG_ADMIN
from tests.support import unavailable


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    import uuid

    import psycopg

    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except Exception as exc:  # noqa: BLE001
        unavailable(f"PostgreSQL not reachable: {exc}")
    name = f"pj_mig_{uuid.uuid4().hex[:10]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_upgrade_keeps_items_of_existing_jobs(empty_url: str) -> None:
    # Given a store at revision 0001 with a job and its pending item
    engine = make_engine(empty_url)
    upgrade(engine, "0001")
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, lanes, params, roots, fingerprint, created_at) "
                "VALUES (1, '[\"noop\"]', '{}', '[]', 'fp', 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO items (job_id, lane, position, state, attempt, fencing_token, not_before, "
                "updated_at) VALUES (1, 'noop', 0, 'pending', 0, 0, 0, 0)"
            )
        )
    # When it is upgraded to the newest revision
    upgrade(engine)
    # Then the item is still there (SQLite must not have copied and dropped ``jobs``: its foreign key
    # cascades) and the old job counts as fully submitted
    assert current_revision(engine) is not None
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM items")).scalar_one() == 1
    status = store_jobs.job_status(engine, 1)
    assert status.state == "running" and status.submission is None
    assert store_jobs.find_job_by_fingerprint(engine, "fp") == 1
    engine.dispose()
