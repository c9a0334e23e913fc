"""Test support: deadlines instead of sleeps, a private Redis server, worker fleets, store queries."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import psutil
import pytest
import redis
from sqlalchemy import Engine, func, select, text, update
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.cli_support import worker_command, worker_env
from photos import fileops
from store import intents as store_intents
from store import items as store_items
from store.clock import db_now
from store.fencing import fenced
from store.jobs import PhotoInput
from store.lanes import LaneSpec
from store.models import Event, Item
from tests import fork_server

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
IN_CI = os.environ.get("CI") == "true"
# This pytest process under pytest-xdist (gw0, gw1, ...), or "main" in a serial run: names what each
# worker must own alone (its PostgreSQL template, its lockdep folder); ports and folders are
# already per process (free_port, tmp_path_factory's per-worker basetemp).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")


def unavailable(reason: str) -> NoReturn:
    """Something a test needs is missing: a skip on a developer's machine, a failure under
    ``CI=true`` (``.ci/run`` provides Redis, PostgreSQL, exiftool, chromium and the packages)."""
    if IN_CI:
        pytest.fail(f"required under CI: {reason}")
    pytest.skip(reason)


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.05) -> T:
    """Call ``predicate`` until it returns something truthy or ``timeout`` seconds have passed; its
    last value (falsy at the deadline). The one polling loop of the tests: ``wait_for`` fails at the
    deadline, a caller that reports the last state itself uses this."""
    deadline = time.monotonic() + timeout
    while True:
        last = predicate()
        if last or time.monotonic() > deadline:
            return last
        time.sleep(interval)


def wait_for(predicate: Callable[[], T], timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` seconds."""
    last: Any = poll(predicate, timeout, interval)
    if not last:
        raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate} (last: {last!r})")
    return last


def alive(pid: int) -> bool:
    """The process ``pid`` exists and is not a zombie (a pid, not a ``psutil.Process``: a pid reused
    by a later process counts as alive; use ``still_running`` where that matters)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def still_running(p: psutil.Process) -> bool:
    """``p`` itself is alive and not a zombie: not merely some later process that got its pid
    (psutil compares the start time; pids wrap quickly where ``pid_max`` is 32768)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on a free loopback port, so tests may FLUSHALL or restart it freely."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server); CI installs it")
        self.binary = binary
        self.workdir = workdir
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            cwd=self.workdir,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._pings, 10, what=f"redis-server on port {self.port}")

    def _pings(self) -> bool:
        try:
            return bool(self.client().ping())
        except redis.ConnectionError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        """A Redis restart without persistence: every message is gone."""
        self.stop()
        self.start()



class Fleet:
    """Real ``dramatiq actors`` worker processes (and optionally a sweeper process) for one test."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env = env
        self.logdir = logdir
        self.procs: list[subprocess.Popen[bytes] | fork_server.Forked] = []

    def start_worker(
        self, lanes: list[str] | None = None, threads: int = 2, env: dict[str, str] | None = None
    ):  # type: ignore[no-untyped-def]
        lanes = lanes or ["noop"]
        full_env = {**self.env, **worker_env(threads, {}), **(env or {})}
        return self._launch("worker", worker_command(lanes, threads), full_env)

    def start_sweeper(self) -> subprocess.Popen[bytes] | fork_server.Forked:
        return self._launch("sweeper", [sys.executable, "-m", "photojobs", "sweep"], self.env)

    def _launch(
        self, name: str, argv: list[str], env: dict[str, str]
    ) -> subprocess.Popen[bytes] | fork_server.Forked:
        """``argv`` in a session of its own (forked by the fork server), its output in
        ``NAME-N.log``; kept for ``stop``."""
        with open(self.logdir / f"{name}-{len(self.procs)}.log", "ab") as log:
            proc = fork_server.popen(argv, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
        self.procs.append(proc)
        return proc

    def kill(self, proc: subprocess.Popen[bytes] | fork_server.Forked) -> None:
        """SIGKILL every process of ``proc``'s group (its session: the worker's Dramatiq children
        too) while its leader is not reaped yet (so the group id is still ours), then reap it.
        ``proc.kill()`` alone leaves those children running as orphans, which go on consuming this
        test worker's Redis queues in later tests (two fresh-clone runs: a later test's messages
        taken by a killed test's worker child, its items queued forever)."""
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:  # a group whose leader was reaped may have a reused id: kill with ``kill``
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        break
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass

    def logs(self) -> str:
        return "\n".join(
            f"--- {f.name}\n{f.read_text(errors='replace')[-3000:]}"
            for f in sorted(self.logdir.glob("*.log"))
        )


def pid_of_owner(owner: str | None) -> int:
    assert owner, "item has no lease owner"
    return int(owner.split(":")[1])


def item_states(engine: Engine, job_id: int) -> dict[str, int]:
    with Session(engine) as s:
        return dict(
            s.execute(
                select(Item.state, func.count()).where(Item.job_id == job_id).group_by(Item.state)
            ).all()
        )


def item_row(engine: Engine, item_id: int) -> Item:
    """The item's row (it must exist)."""
    with Session(engine) as s:
        row = s.get(Item, item_id)
        assert row is not None, f"no item {item_id}"
        return row


def events_of(
    engine: Engine, type: str, item_id: int | None = None, *, worker: str | None = None
) -> list[Event]:
    """The events of ``type`` (of one item, of one worker, if given), in id order."""
    with Session(engine) as s:
        q = select(Event).where(Event.type == type)
        if item_id is not None:
            q = q.where(Event.item_id == item_id)
        if worker is not None:
            q = q.where(Event.worker == worker)
        return list(s.execute(q.order_by(Event.id)).scalars())


def items_of(engine: Engine, job_id: int) -> list[Item]:
    with Session(engine) as s:
        return list(s.execute(select(Item).where(Item.job_id == job_id).order_by(Item.id)).scalars())


def expire_running_leases(engine: Engine) -> None:
    """The worker holding the running items' leases died: they run out (database clock)."""
    with Session(engine) as s, s.begin():
        s.execute(update(Item).where(Item.state == "running").values(lease_expires_at=db_now() - 1))


def event_counts(engine: Engine, type: str, job_id: int | None = None) -> dict[int, int]:
    """{item id: number of events of ``type``}."""
    with Session(engine) as s:
        q = select(Event.item_id, func.count()).where(Event.type == type).group_by(Event.item_id)
        if job_id is not None:
            q = q.where(Event.job_id == job_id)
        return dict(s.execute(q).all())


def job_done(engine: Engine, job_id: int) -> bool:
    states = item_states(engine, job_id)
    return sum(v for k, v in states.items() if k in ("succeeded", "failed", "cancelled", "skipped")) == sum(
        states.values()
    )


def wait_job_done(engine: Engine, job_id: int, timeout: float = 180.0) -> int:
    """Wait (deadline ``timeout``) until every item of the job is terminal; the job id. A timeout
    names the job and its item states."""
    if not poll(lambda: job_done(engine, job_id), timeout):
        states = item_states(engine, job_id)
        raise AssertionError(f"timed out after {timeout}s waiting for job {job_id} to finish: {states}")
    return job_id


def run_job(
    client: Client,
    engine: Engine,
    fleet: Fleet | None,
    lanes: list[str],
    folder: Path,
    params: dict[str, str] | None = None,
    threads: int = 2,
    timeout: float = 180.0,
) -> int:
    """Submit a job of ``lanes`` over ``folder`` and wait until it is done; its id. With ``fleet``,
    start its sweeper and one worker on ``lanes`` (else the test's workers are already running)."""
    job = client.submit(lanes, [folder], params or {}).job_id
    if fleet is not None:
        fleet.start_sweeper()
        fleet.start_worker(lanes, threads=threads)
    return wait_job_done(engine, job, timeout)


def photo_inputs(folder: Path, n: int, size: int = 1) -> list[PhotoInput]:
    """``n`` submission inputs ``folder/p0.jpg`` ... (the files need not exist for store tests)."""
    return [PhotoInput(str(folder / f"p{i}.jpg"), size) for i in range(n)]


def record_staged_edit(
    engine: Engine, spec: LaneSpec, item_id: int, photo: Path, worker: str = "doomed"
) -> tuple[store_items.Lease, Path, int]:
    """Claim item ``item_id`` and record a staged edit of ``photo`` (an intent, not applied), as an
    attempt does before it dies: its lease, the staged file and the intent's id."""
    lease = store_items.claim(engine, spec, item_id, 0, worker).lease
    assert lease is not None
    staged = fileops.staged_path(photo, f"i{item_id}-t{lease.token}")
    staged.write_bytes(b"EDITED")
    with fenced(engine, item_id, lease.token) as s:
        intent = store_intents.record(
            s,
            lease,
            kind="replace",
            staged=str(staged),
            target=str(photo),
            source=str(photo),
            sha256=fileops.sha256_file(staged),
            base_sha256=fileops.sha256_file(photo),
            worker=worker,
        )
    return lease, staged, intent


def waiting_for_a_lock(engine: Engine) -> int:
    """PostgreSQL: how many backends of this test's own database (not another test's, on the same
    server) wait for a row or transaction lock now."""
    with engine.connect() as c:
        return int(
            c.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        )


def make_files(folder: Path, n: int, prefix: str = "f") -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(n):
        p = folder / f"{prefix}{i:05d}.txt"
        p.write_text(str(i))
        out.append(p)
    return out


def photojobs(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m photojobs ARGS`` with ``env``: its exit status and output (text)."""
    return fork_server.run([sys.executable, "-m", "photojobs", *args], cwd=ROOT, env=env, timeout=120)


class MotoServer:
    """moto's S3-compatible server in its own process on 127.0.0.1 (a real HTTP endpoint)."""

    def __init__(self, logdir: Path) -> None:
        self.port = free_port()
        self.log = logdir / "moto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> str:
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )

        def listening() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"moto server exited: {self.log.read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return True
            except OSError:
                return False

        wait_for(listening, 30, what=f"moto server on port {self.port}")
        return self.endpoint

    def s3_client(self, bucket: str | None = None) -> Any:
        """A boto3 S3 client of this server with the test credentials; ``bucket`` created if named."""
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")  # fmt: skip
        if bucket is not None:
            s3.create_bucket(Bucket=bucket)
        return s3

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
}

