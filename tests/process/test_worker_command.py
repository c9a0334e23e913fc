"""``photojobs worker`` as an operator runs it: its workers die with it, orphans of a dead earlier
fleet are found by recorded identity, ``--watch`` reloads, and a Redis outage is a few quiet lines."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from photojobs.lifeline import ENV_TOKEN, start_time
from tests.support import ROOT, RedisServer, alive, still_running, wait_for


def token_processes(token: str) -> list[psutil.Process]:
    """Live processes carrying a fleet token in their environment (a fleet's workers)."""
    found = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(ENV_TOKEN) == token:
                found.append(proc)
    return found


@dataclass
class Commands:
    """``photojobs worker`` commands and helper processes of one test; all killed at teardown."""

    tmp_path: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)

    @property
    def runtime(self) -> Path:
        return self.tmp_path / "runtime"

    def worker(self, env: dict[str, str], *args: str) -> tuple[subprocess.Popen[bytes], Path]:
        err = self.tmp_path / f"worker-{len(self.procs)}.err"
        with open(err, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "photojobs", "worker", "--lanes", "noop", "--threads", "1", *args],
                cwd=ROOT,
                env={**env, "PHOTOJOBS_RUNTIME_DIR": str(self.runtime)},
                stdin=subprocess.DEVNULL,
                stdout=fh,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.procs.append(proc)
        return proc, err

    def sleeper(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        code = "import time; time.sleep(600)"
        proc = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
        self.procs.append(proc)
        return proc

    def fleet(self, pid: int, processes: int) -> tuple[str, list[psutil.Process]]:
        """The token of the fleet of ``photojobs worker`` ``pid``, once all its workers run (each a
        dramatiq main process with its forked worker process)."""

        def up() -> tuple[str, list[psutil.Process]] | None:
            try:
                record = json.loads((self.runtime / f"worker-{pid}.json").read_text())
            except (OSError, ValueError):
                return None
            procs = token_processes(record["token"])
            return (record["token"], procs) if len(procs) >= 2 * processes else None

        token, procs = wait_for(up, 90, what="the fleet's workers")
        self.tokens.append(token)
        return token, procs

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for token in self.tokens:
            for leftover in token_processes(token):
                with contextlib.suppress(psutil.Error):
                    leftover.kill()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def commands(tmp_path: Path) -> Iterator[Commands]:
    c = Commands(tmp_path)
    try:
        yield c
    finally:
        c.cleanup()


def test_sigkilled_worker_command_takes_every_worker_process_along(
    commands: Commands, env: dict[str, str]
) -> None:
    # Given `photojobs worker` with two supervised workers (each a dramatiq main + a forked worker)
    proc, err = commands.worker(env, "--processes", "2")
    token, workers = commands.fleet(proc.pid, 2)
    assert len(workers) >= 4 and proc.pid not in {w.pid for w in workers}
    # When the command is SIGKILLed (no chance to stop anything)
    proc.kill()
    proc.wait(timeout=30)
    # Then no process of its fleet is alive 5 s later (by token, and each one by identity: an
    # exiting process whose environment can no longer be read drops out of the token search
    # before it is gone — CI failure)
    def fleet_gone() -> bool:
        return not token_processes(token) and not any(still_running(w) for w in workers)

    try:
        wait_for(fleet_gone, 5, what="the workers to die with their supervisor")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{err.read_text()}") from None


def test_worker_command_stops_orphans_of_a_dead_fleet_by_recorded_identity(
    commands: Commands, env: dict[str, str], tmp_path: Path
) -> None:
    # Given a fleet record whose owner is dead, with a worker that carries the record's token and
    # has a child in its process group that does not carry it
    commands.runtime.mkdir(mode=0o700)
    gone = subprocess.Popen(["true"])
    gone.wait()
    no_token = {k: v for k, v in env.items() if k != ENV_TOKEN}
    child_code = (
        "import os, subprocess, sys, time; env = dict(os.environ); env.pop('PHOTOJOBS_FLEET_TOKEN');"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], env=env);"
        "open(sys.argv[1], 'w').write(str(c.pid)); time.sleep(600)"
    )
    child_file = tmp_path / "child.pid"
    orphan = subprocess.Popen(
        [sys.executable, "-c", child_code, str(child_file)],
        env={**no_token, ENV_TOKEN: "deadbeef"},
        start_new_session=True,
    )
    commands.procs.append(orphan)
    child = int(wait_for(lambda: child_file.exists() and child_file.read_text(), 30, what="the child"))
    (commands.runtime / "worker-1.json").write_text(json.dumps({
        "owner": {"pid": gone.pid, "start": 1},
        "token": "deadbeef",
        "workers": [{"pid": orphan.pid, "start": start_time(orphan.pid)}],
    }))  # fmt: skip
    # And a record of a live owner (this test) whose worker carries that record's token
    living = commands.sleeper({**no_token, ENV_TOKEN: "cafe"})
    (commands.runtime / "worker-2.json").write_text(json.dumps({
        "owner": {"pid": os.getpid(), "start": start_time(os.getpid())},
        "token": "cafe",
        "workers": [{"pid": living.pid, "start": start_time(living.pid)}],
    }))  # fmt: skip
    # When `photojobs worker` starts
    proc, err = commands.worker(env, "--processes", "1")
    commands.fleet(proc.pid, 1)
    # Then it stopped the dead fleet's worker (and only it) and dropped that record
    wait_for(lambda: not alive(orphan.pid), 10, what="the orphan to be stopped")
    assert "stopped 1 orphaned process(es) of an earlier fleet" in err.read_text()
    assert alive(child), "a process without the fleet's token was killed"
    assert alive(living.pid), "the worker of a live owner was killed"
    assert not (commands.runtime / "worker-1.json").exists()
    assert (commands.runtime / "worker-2.json").exists()
    with contextlib.suppress(ProcessLookupError):
        os.kill(child, signal.SIGKILL)


def test_watch_reloads_the_workers_and_they_still_die_with_the_command(
    commands: Commands, env: dict[str, str], tmp_path: Path
) -> None:
    # Given `photojobs worker --watch DIR` with one worker
    src = tmp_path / "src"
    src.mkdir()
    (src / "module.py").write_text("X = 1\n")
    proc, err = commands.worker(env, "--processes", "1", "--watch", str(src))
    token, _ = commands.fleet(proc.pid, 1)
    [main] = psutil.Process(proc.pid).children()
    before = {c.pid for c in main.children()}
    assert before
    # When a Python file under DIR changes (again every few seconds until it is noticed: dramatiq
    # starts watching only after its worker process is up)
    edits = [0.0]

    def reloaded() -> bool:
        if time.monotonic() - edits[0] > 3:
            edits[0] = time.monotonic()
            (src / "module.py").write_text(f"X = {edits[0]}\n")
        now = {c.pid for c in main.children()}
        return bool(now) and not now & before

    # Then the worker reloads: the same main process (re-executed) forks a new worker process
    wait_for(reloaded, 60, what="a reload")
    assert "reloading on changes under" in err.read_text()
    # And after the reload the fleet still dies with its supervisor
    proc.kill()
    proc.wait(timeout=30)
    wait_for(lambda: not token_processes(token), 5, what="the reloaded workers to die with their supervisor")


def test_redis_outage_is_a_few_quiet_lines_with_the_next_retry(
    commands: Commands, env: dict[str, str], tmp_path: Path
) -> None:
    # Given `photojobs worker` (two worker processes, every lane) on a Redis of its own
    server = RedisServer(tmp_path / "redis")
    server.start()
    try:
        proc, err = commands.worker(
            {**env, "PHOTOJOBS_REDIS_URL": server.url}, "--processes", "2", "--lanes", "noop,exif,rename"
        )
        commands.fleet(proc.pid, 2)
        wait_for(lambda: err.read_text().count("Worker process is ready for action") >= 2, 60, what="ready")
        # When Redis goes away for a while (three retry periods)
        server.stop()
        began = time.monotonic()
        wait_for(lambda: err.read_text().count("Redis unreachable") >= 6, 60, what="three retry periods")
        elapsed = time.monotonic() - began
    finally:
        server.stop()
    text = err.read_text()
    outage = [line for line in text.splitlines() if "Redis unreachable" in line]
    # Then there is no traceback and no line per consumer: one line per process per retry period
    # (3 s), each naming the next retry time
    assert "Traceback" not in text
    assert "Consumer encountered" not in text and "Restarting consumer" not in text
    assert all("next at" in line for line in outage)
    assert len(outage) <= 2 * (elapsed / 3 + 2), outage
