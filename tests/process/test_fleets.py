"""Two ``photojobs worker`` fleets, each with its own sweeper, sharing one PostgreSQL and one Redis.

A fleet is ``photojobs worker`` -> a Supervisor of ``dramatiq actors`` processes (each in its own
session) -> each with one dramatiq worker process, whose pid is in the ``host:pid:…`` worker id of
the events it writes.  Claims are mapped to fleets through the fleets' process trees (psutil).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from store.engine import make_engine
from store.models import Event
from tests.support import (
    ROOT,
    event_counts,
    item_states,
    job_done,
    make_files,
    pid_of_owner,
    still_running,
    wait_for,
)

PROCESSES = 2


class WorkerFleet:
    """One ``photojobs worker --lanes noop --processes 2 --threads 2`` (with its sweeper)."""

    def __init__(self, name: str, env: dict[str, str], logdir: Path) -> None:
        self.name = name
        self.log = logdir / f"fleet-{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "photojobs", "worker", "--lanes", "noop"]
                + ["--processes", str(PROCESSES), "--threads", "2"],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.seen: dict[int, psutil.Process] = {}

    def descendants(self) -> set[int]:
        """Pids now in this fleet's process tree (also remembered for the pid mapping and clean-up)."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            kids = []
        for kid in kids:
            self.seen.setdefault(kid.pid, kid)
        return {k.pid for k in kids}

    def ready(self) -> bool:
        """Every worker process of the fleet is consuming."""
        self.descendants()
        return self.log.read_text(errors="replace").count("Worker process is ready for action") >= PROCESSES

    def live_leftovers(self) -> list[int]:
        return [pid for pid, proc in self.seen.items() if still_running(proc)]

    def logs(self) -> str:
        return f"--- fleet {self.name}\n{self.log.read_text(errors='replace')[-4000:]}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.descendants()
        for proc in self.seen.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()  # psutil refuses a pid that now belongs to another process
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=10)


@pytest.fixture
def fleet_env(pg_url: str, redis_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOTOJOBS_")}
    env.update(
        PHOTOJOBS_DATABASE_URL=pg_url,
        PHOTOJOBS_REDIS_URL=redis_url,
        PHOTOJOBS_LEASE_TTL="2",
        PHOTOJOBS_HEARTBEAT_INTERVAL="0.5",
        PHOTOJOBS_SWEEP_INTERVAL="0.5",
        PHOTOJOBS_REPUBLISH_AFTER="1",
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture
def pg_engine(pg_url: str) -> Iterator[Engine]:
    eng = make_engine(pg_url)
    yield eng
    eng.dispose()


@pytest.fixture
def gate(tmp_path: Path) -> Path:
    """Fleet b's gate: while ``gate`` is missing, fleet b's items wait just before they commit."""
    folder = tmp_path / "gate"
    folder.mkdir()
    go = folder / "noop.before_commit.go"
    go.touch()
    return go


@pytest.fixture
def two_fleets(
    fleet_env: dict[str, str], gate: Path, tmp_path: Path
) -> Iterator[tuple[WorkerFleet, WorkerFleet]]:
    fleets: list[WorkerFleet] = []
    gated = dict(
        fleet_env,
        PHOTOJOBS_FAILPOINTS="noop.before_commit:wait",
        PHOTOJOBS_FAILPOINT_DIR=str(gate.parent),
    )
    try:
        fleets.append(WorkerFleet("a", fleet_env, tmp_path))
        fleets.append(WorkerFleet("b", gated, tmp_path))
        for fleet in fleets:
            wait_for(fleet.ready, 60, what=f"fleet {fleet.name}'s workers to be ready")
        yield fleets[0], fleets[1]
    finally:
        for fleet in fleets:
            fleet.kill()


def submit_noop(env: dict[str, str], folder: Path, n: int, sleep: float) -> int:
    make_files(folder, n)
    client = Client(Settings.from_env(env))
    try:
        return client.submit(["noop"], [folder], {"noop.sleep": str(sleep)}).job_id
    finally:
        client.engine.dispose()


def claim_pids(engine: Engine, job: int, after_event: int = 0) -> list[int]:
    with Session(engine) as s:
        owners = s.execute(
            select(Event.worker).where(
                Event.job_id == job, Event.type == "item_claimed", Event.id > after_event
            )
        ).scalars()
        return [pid_of_owner(o) for o in owners]


def assert_each_item_succeeded_once(engine: Engine, job: int, n: int) -> None:
    assert item_states(engine, job) == {"succeeded": n}
    counts = event_counts(engine, "item_succeeded", job)
    assert len(counts) == n and set(counts.values()) == {1}


def test_two_fleets_share_a_job_and_one_fleet_stopping_leaves_the_rest_to_the_other(
    pg_engine: Engine,
    fleet_env: dict[str, str],
    two_fleets: tuple[WorkerFleet, WorkerFleet],
    gate: Path,
    tmp_path: Path,
) -> None:
    a, b = two_fleets
    # Given two running fleets (2 processes x 2 threads and a sweeper each) on one PostgreSQL and Redis
    assert a.descendants() and b.descendants() and not a.descendants() & b.descendants()

    # When a 200-item noop job is submitted
    job = submit_noop(fleet_env, tmp_path / "job1", 200, 0.05)

    # Then it completes, every item succeeded exactly once
    wait_for(lambda: job_done(pg_engine, job), 90, what="the first job to finish")
    assert_each_item_succeeded_once(pg_engine, job, 200)
    # And both fleets did part of the work (claims map onto both fleets' worker processes)
    a.descendants(), b.descendants()
    pids = claim_pids(pg_engine, job)
    assert len(pids) == 200
    assert set(pids) <= set(a.seen) | set(b.seen), (set(pids), set(a.seen), set(b.seen))
    assert set(pids) & set(a.seen) and set(pids) & set(b.seen)

    # Given a second job that both fleets are working on, fleet b's items held just before they
    # commit (so the job cannot finish before fleet a has stopped, however slow that stop is)
    gate.unlink()
    job2 = submit_noop(fleet_env, tmp_path / "job2", 160, 0.2)

    def both_busy() -> bool:
        a.descendants(), b.descendants()
        done = item_states(pg_engine, job2).get("succeeded", 0)
        claimed = set(claim_pids(pg_engine, job2))
        return done >= 20 and bool(claimed & set(a.seen)) and bool(claimed & set(b.seen))

    wait_for(both_busy, 60, what="both fleets to be working on the second job")

    # When fleet a gets SIGTERM mid-job
    a.proc.send_signal(signal.SIGTERM)

    # Then fleet a stops cleanly, leaving no worker process behind
    try:
        assert a.proc.wait(timeout=60) == 0, a.logs()
    except subprocess.TimeoutExpired:
        raise AssertionError(f"fleet a did not stop within 60s\n{a.logs()}") from None
    wait_for(lambda: not a.live_leftovers(), 15, what="fleet a's worker processes to be gone")
    with Session(pg_engine) as s:
        mark = s.execute(select(func.max(Event.id))).scalar_one()
    assert not job_done(pg_engine, job2), "the second job finished before fleet a stopped"
    gate.touch()

    # And fleet b finishes the job alone, nothing twice
    wait_for(lambda: job_done(pg_engine, job2), 120, what="fleet b to finish the second job")
    assert_each_item_succeeded_once(pg_engine, job2, 160)
    b.descendants()
    later = set(claim_pids(pg_engine, job2, after_event=mark))
    assert later, "fleet b claimed nothing after fleet a stopped"
    assert later <= set(b.seen) and not later & set(a.seen)
    assert b.proc.poll() is None
    # And the graceful stop abandoned no lease: nothing had to be recovered; an item was claimed a
    # second time only when fleet a had released it because it was shutting down
    assert event_counts(pg_engine, "lease_expired", job2) == {}
    with Session(pg_engine) as s:
        released = {
            e.item_id: e
            for e in s.execute(
                select(Event).where(Event.job_id == job2, Event.type == "item_released")
            ).scalars()
        }
    for item, n in event_counts(pg_engine, "item_claimed", job2).items():
        assert n == 1 or (n == 2 and item in released), (item, n)
    for event in released.values():
        assert pid_of_owner(event.worker) in a.seen and "shutdown" in event.detail["reason"], event.detail
