"""Redis and the database going away mid-run: nothing lost, nothing twice."""

from __future__ import annotations

from pathlib import Path

import psycopg
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.config import Settings
from tests.conftest import PG_ADMIN
from tests.support import Fleet, RedisServer, event_counts, items_of, job_done, make_files, wait_for


def test_redis_restart_without_persistence_mid_job(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path, redis_server: RedisServer
) -> None:
    # Given a 30-item job in progress
    make_files(tmp_path / "photos", 30)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "0.3"}).job_id
    fleet.start_sweeper()
    fleet.start_worker(threads=2)
    fleet.start_worker(threads=2)
    wait_for(lambda: event_counts(engine, "item_succeeded", job), 60, what="some items to finish")
    # When Redis is stopped and started again on the same port, empty
    redis_server.restart()
    # Then workers and sweeper reconnect and every item completes exactly once
    wait_for(lambda: job_done(engine, job), 120, what="the job to finish after the Redis restart")
    assert {i.state for i in items_of(engine, job)} == {"succeeded"}
    assert set(event_counts(engine, "item_succeeded", job).values()) == {1}
    client.engine.dispose()


def test_postgresql_connections_killed_mid_job(pg_url: str, redis_url: str, tmp_path: Path) -> None:
    # Given a 30-item job on PostgreSQL in progress
    from store.engine import make_engine
    from tests.conftest import _worker_env

    env = _worker_env(pg_url, redis_url)
    logdir = tmp_path / "logs"
    logdir.mkdir()
    fleet = Fleet(env, logdir)
    engine = make_engine(pg_url)
    try:
        make_files(tmp_path / "photos", 30)
        client = Client(Settings.from_env(env))
        job = client.submit(["noop"], [tmp_path / "photos"], {"noop.sleep": "0.3"}).job_id
        fleet.start_sweeper()
        fleet.start_worker(threads=2)
        fleet.start_worker(threads=2)
        wait_for(lambda: event_counts(engine, "item_succeeded", job), 60, what="some items to finish")
        # When every other connection to the database is terminated, three times
        database = pg_url.rsplit("/", 1)[1]
        for _ in range(3):
            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()",
                    (database,),
                )
            done = len(event_counts(engine, "item_succeeded", job))
            wait_for(
                lambda done=done: len(event_counts(engine, "item_succeeded", job)) > done,
                60,
                what="progress after the connections were killed",
            )
        # Then the job still completes, every item exactly once
        wait_for(lambda: job_done(engine, job), 120, what="the job to finish")
        assert {i.state for i in items_of(engine, job)} == {"succeeded"}
        assert set(event_counts(engine, "item_succeeded", job).values()) == {1}
        client.engine.dispose()
    finally:
        fleet.stop()
        engine.dispose()
