"""A worker fleet shared by the tests of one module (tests/conftest.py's ``shared_fleet``).

A process test pays for its fleet before it proves anything: a sweeper and a ``dramatiq`` worker
booting (~1.7 s of CPU and as long in wall time on an idle 2-core machine, several seconds under
load) and, on PostgreSQL, a database of its own. Tests that only need jobs run to their end by
healthy workers (no failpoint, no kill, no setting of their own) share one instead: one store of
each kind, a private Redis and a fleet kept for the module's tests, each test with jobs and photo
folders of its own and its assertions about its own jobs. A test that submits its jobs before its
workers may take any of them (jobs meant to run at once, a file deleted after its submission)
submits them inside ``held()``: the workers are stopped (SIGSTOP) meanwhile and all resume together,
as a fleet started after the submissions would. Tests that kill, freeze or configure their
workers keep the ``fleet`` fixture.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, text

from photojobs.api import Client
from photojobs.config import Settings
from tests.support import Fleet, wait_for


class SharedFleet:
    """One store (``engine``, ``env``), its Redis and a fleet for the tests of one module: a sweeper
    and one worker per set of lanes asked for, each started once (``serve``)."""

    def __init__(self, env: dict[str, str], engine: Engine, logdir: Path) -> None:
        self.env = env
        self.engine = engine
        self.fleet = Fleet(env, logdir)
        self._workers: dict[tuple[str, ...], list[subprocess.Popen[bytes]]] = {}
        self._sweeping = False

    def serve(self, lanes: Sequence[str], threads: int = 2, workers: int = 1) -> Client:
        """A sweeper and ``workers`` workers of ``threads`` threads on ``lanes`` running (started
        by the first test that asks, again if one died); a client of the store (the caller
        disposes of its engine)."""
        if not self._sweeping:
            self.fleet.start_sweeper()
            self._sweeping = True
        procs = self._workers.setdefault(tuple(lanes), [])
        procs[:] = [p for p in procs if p.poll() is None]
        while len(procs) < workers:
            procs.append(self.fleet.start_worker(list(lanes), threads=threads))
        return Client(Settings.from_env(self.env))

    @contextmanager
    def held(self, lanes: Sequence[str], threads: int = 2, workers: int = 1) -> Iterator[Client]:
        """``serve(lanes, threads, workers)``'s workers stopped (SIGSTOP, their whole process group)
        for the block and resumed (SIGCONT) after it: what is submitted inside is all waiting when
        they take work, none of it taken before the block ends. Yields ``serve``'s client. The
        block must be short next to the lease TTL (a held worker renews nothing; it holds nothing
        between tests either)."""
        client = self.serve(lanes, threads, workers)
        procs = self._workers[tuple(lanes)]
        between = lambda: self._stopped_between_transactions(procs)  # noqa: E731
        wait_for(between, 30, what="the workers stopped between transactions")
        try:
            yield client
        finally:
            self._signal(procs, signal.SIGCONT)

    def _signal(self, procs: list[subprocess.Popen[bytes]], sig: int) -> None:
        for p in procs:
            os.killpg(p.pid, sig)

    def _stopped_between_transactions(self, procs: list[subprocess.Popen[bytes]]) -> bool:
        """Stop ``procs``; True if none of them was stopped inside a transaction (a heartbeat's,
        which would hold SQLite's write lock or PostgreSQL row locks for the whole block), else
        resume them (to try again) and False."""
        self._signal(procs, signal.SIGSTOP)
        if not self._in_transaction():
            return True
        self._signal(procs, signal.SIGCONT)
        return False

    def _in_transaction(self) -> bool:
        """Another connection is inside a transaction on the store now: on SQLite, the write lock
        cannot be taken at once; on PostgreSQL, another backend of the store's database is in one."""
        if self.engine.dialect.name == "sqlite":
            probe = sqlite3.connect(str(self.engine.url.database), timeout=0, isolation_level=None)
            try:
                probe.execute("BEGIN IMMEDIATE")
                probe.execute("ROLLBACK")
                return False
            except sqlite3.OperationalError:  # locked
                return True
            finally:
                probe.close()
        with self.engine.connect() as conn:
            busy = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
                )
            ).scalar_one()
        return bool(busy)

    def logs(self) -> str:
        return self.fleet.logs()

    def stop(self) -> None:
        self.fleet.stop()
