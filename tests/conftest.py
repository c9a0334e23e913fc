"""Fixtures: a private Redis, SQLite and PostgreSQL stores (the same test runs on both), worker fleets."""

from __future__ import annotations

import os
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from store import lockdep
from store.engine import make_engine
from store.schema import upgrade
from tests import fresh_stores, store_split
from tests.fresh_stores import PgDatabases
from tests.shared_fleet import SharedFleet
from tests.support import XDIST_WORKER, Fleet, RedisServer, unavailable

# The time budget: each run prints its slowest tests and folder totals and writes them for
# `python -m tests.budget check`; under xdist the budget orders the run (tests/budget_plugin.py).
pytest_plugins = ["tests.budget_plugin"]

# The tests' own `exiftool` commands run the ExifTool the code runs: the pinned one `make` installs
# next to this interpreter (photos.exiftool.executable), ahead of the system's on PATH.
if os.path.isfile(os.path.join(sys.prefix, "bin", "exiftool")):
    os.environ["PATH"] = os.path.join(sys.prefix, "bin") + os.pathsep + os.environ.get("PATH", "")

PG_ADMIN = os.environ.get("PHOTOJOBS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")
# One template per pytest process: each xdist worker (gw0, gw1, ...) migrates and drops its own.
TEMPLATE = f"pj_template_{XDIST_WORKER}_{os.getpid()}"


@pytest.hookimpl(tryfirst=True)  # before ``-m "not slow"`` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A process test runs on one store in ``make test``, the other in ``make chaos``
    (``tests/store_split.py``)."""
    store_split.split(items)


def _pg_available() -> str | None:
    try:
        with psycopg.connect(PG_ADMIN, connect_timeout=3):
            return None
    except Exception as exc:  # noqa: BLE001
        return str(exc)


@pytest.fixture(scope="session", autouse=True)
def lockdep_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str | None]:
    """The lock-order checker (store/lockdep.py) for the whole session: every PostgreSQL engine made
    here or in a worker/sweeper/web process started with this environment records the transactions
    that lock against the global order. ``PHOTOJOBS_LOCKDEP=off`` turns it off. Each xdist worker
    has its own folder (a folder given in the environment gets one sub-folder per worker): a test
    clears and reads only the violations of its own worker's processes."""
    if os.environ.get(lockdep.ENV, "").lower() in ("off", "0", "no"):
        os.environ.pop(lockdep.ENV, None)
        yield None
        return
    given = os.environ.get(lockdep.ENV)
    if given:
        folder = os.path.join(given, XDIST_WORKER)
        os.makedirs(folder, exist_ok=True)
    else:
        folder = str(tmp_path_factory.mktemp("lockdep"))
    os.environ[lockdep.ENV] = folder
    yield folder


class LockOrderWarning(UserWarning):
    """A lock-order violation that fails no test: a known one (``store.lockdep.KNOWN``) or an
    ascending-id one of a statement that cannot wait (``store.lockdep.CANNOT_WAIT``)."""


@pytest.fixture(autouse=True)
def lock_order(lockdep_dir: str | None) -> Iterator[None]:
    """Fail the test (at teardown, after its processes stopped) in which any transaction, in this
    process or one it started, locked rows against the global order: tables job -> item -> photo ->
    intent -> photo-lock rows, ascending id within a table (store/lockdep.py); the listed
    exceptions (``KNOWN``, ``CANNOT_WAIT``) are shown as warnings."""
    if lockdep_dir is None:
        yield
        return
    lockdep.clear(lockdep_dir)
    yield
    found = lockdep.read_violations(lockdep_dir)
    lockdep.clear(lockdep_dir)
    failing = [v for v in found if lockdep.failing(v)]
    shown_only = [v for v in found if not lockdep.failing(v)]
    if shown_only:
        known = sum(1 for v in shown_only if v.get("known"))
        first = "\n\n".join(lockdep.format_violation(v) for v in shown_only[:3])
        warnings.warn(
            LockOrderWarning(
                f"{len(shown_only)} lock-order warning(s): {known} known (store.lockdep.KNOWN), "
                f"{len(shown_only) - known} that cannot wait (store.lockdep.CANNOT_WAIT); "
                f"first ones:\n{first}"
            ),
            stacklevel=1,
        )
    if failing:
        shown = "\n\n".join(lockdep.format_violation(v) for v in failing[:5])
        more = f"\n\n… and {len(failing) - 5} more" if len(failing) > 5 else ""
        pytest.fail(f"{len(failing)} lock-order violation(s):\n{shown}{more}", pytrace=False)


@pytest.fixture
def photos(tmp_path: Path) -> Path:
    """An empty photo root ``tmp_path/photos`` (a test module may define its own ``photos``)."""
    root = tmp_path / "photos"
    root.mkdir()
    return root


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    redis_server.client().flushall()
    return redis_server.url


@pytest.fixture(scope="session")
def pg_template() -> Iterator[str]:
    problem = _pg_available()
    if problem:
        unavailable(f"PostgreSQL not reachable at {PG_ADMIN}: {problem}")
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}"')
        conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{TEMPLATE}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    yield TEMPLATE
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_databases(pg_template: str) -> Iterator[PgDatabases]:
    """Fresh databases of ``pg_template``, made one test ahead and dropped behind (tests/fresh_stores.py)."""
    pool = PgDatabases(PG_ADMIN, pg_template)
    yield pool
    pool.close()


def _taken_pg(pool: PgDatabases) -> Iterator[str]:
    name = pool.take()
    yield pool.url(name)
    if os.environ.get("PHOTOJOBS_TEST_KEEP_DB"):  # debugging a failed run: keep its store
        print(f"kept database {name}")
        return
    pool.drop(name)


def _fresh_pg(template: str) -> Iterator[str]:
    name = f"pj_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    yield PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    if os.environ.get("PHOTOJOBS_TEST_KEEP_DB"):  # debugging a failed run: keep its store
        print(f"kept database {name}")
        return
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_databases: PgDatabases) -> Iterator[str]:
    """A fresh PostgreSQL database (for the tests of PostgreSQL-only behaviour)."""
    yield from _taken_pg(pg_databases)


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite store, copied for each test (tests/fresh_stores.py)."""
    return fresh_stores.sqlite_template(tmp_path_factory.mktemp("sqlite-template"))


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh, migrated store of each kind: a copy of the SQLite template in the test's tmp dir
    (``photojobs.db``), a new PostgreSQL database."""
    if request.param == "sqlite":
        yield fresh_stores.sqlite_copy(request.getfixturevalue("sqlite_template"), tmp_path / "photojobs.db")
        return
    yield from _taken_pg(request.getfixturevalue("pg_databases"))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    eng = make_engine(db_url)
    yield eng
    eng.dispose()


@pytest.fixture
def env(db_url: str, redis_url: str) -> dict[str, str]:
    """Environment for worker/sweeper processes: short leases so recovery tests run quickly."""
    return _worker_env(db_url, redis_url)


def _worker_env(db_url: str, redis_url: str) -> dict[str, str]:
    return {
        **os.environ,
        "PHOTOJOBS_DATABASE_URL": db_url,
        "PHOTOJOBS_REDIS_URL": redis_url,
        "PHOTOJOBS_LEASE_TTL": "2",
        "PHOTOJOBS_HEARTBEAT_INTERVAL": "0.5",
        "PHOTOJOBS_SWEEP_INTERVAL": "0.5",
        "PHOTOJOBS_REPUBLISH_AFTER": "1",
        "PHOTOJOBS_MAX_ATTEMPTS": "3",
        # The tests' 2 s TTL would give workers a 2 s idle-in-transaction timeout (4/5 of it, floor
        # 2 s): shorter than a CPU-starved worker may sit between two statements of a 70,000-photo
        # claim under a loaded CI. The rule itself is tested with it unset
        # (tests/process/test_frozen_lock_holder.py).
        "PHOTOJOBS_IDLE_TRANSACTION_TIMEOUT": "30",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def fleet(env: dict[str, str], tmp_path: Path) -> Iterator[Fleet]:
    logdir = tmp_path / "logs"
    logdir.mkdir()
    f = Fleet(env, logdir)
    yield f
    f.stop()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_fleet(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SharedFleet]:
    """A store of each kind with a private Redis and a fleet, kept for the tests of one module
    (tests/shared_fleet.py): for tests whose jobs only need healthy workers. Each test makes its
    own jobs and folders and asserts on them."""
    folder = tmp_path_factory.mktemp(f"shared-fleet-{request.param}")
    redis_server = RedisServer(folder / "redis")
    redis_server.start()
    pg_name, pool = None, None
    if request.param == "sqlite":
        url = fresh_stores.sqlite_copy(request.getfixturevalue("sqlite_template"), folder / "photojobs.db")
    else:
        pool = request.getfixturevalue("pg_databases")
        pg_name = pool.take()
        url = pool.url(pg_name)
    engine = make_engine(url)
    logdir = folder / "logs"
    logdir.mkdir()
    shared = SharedFleet(_worker_env(url, redis_server.url), engine, logdir)
    yield shared
    shared.stop()
    engine.dispose()
    redis_server.stop()
    if pool is not None and pg_name is not None and not os.environ.get("PHOTOJOBS_TEST_KEEP_DB"):
        pool.drop(pg_name)
