"""The suite's fork server (tests/fork_server.py): a launched ``python -m`` process sees what a
fresh interpreter would — the launch's environment, folder, arguments and session, and none of the
project's modules (each reads its settings from the environment at import) — and its status comes
back as ``subprocess.Popen`` gives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fork_server
from tests.support import ROOT, wait_for

PROBE = "tests.process.fork_probe"


def launch(tmp_path: Path, *args: str, **env: str) -> tuple[object, Path]:
    out = tmp_path / f"out-{len(list(tmp_path.iterdir()))}.txt"
    with open(out, "wb") as f:
        proc = fork_server.popen(
            [sys.executable, "-m", PROBE, *args],
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            cwd=tmp_path,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, out


def seen(out: Path) -> dict:
    return json.loads(out.read_text().splitlines()[0])


def test_a_forked_process_imports_the_project_afresh_under_its_own_environment(tmp_path: Path) -> None:
    # Given two launches through the fork server with different environments and arguments
    first, out1 = launch(tmp_path, "3", PJ_PROBE="one")
    second, out2 = launch(tmp_path, "0", PJ_PROBE="two")
    # When they end
    # Then each ran as a fork (a library preloaded), with none of the project's or Dramatiq's modules
    # imported before it, its own environment, folder, arguments and session, and its own status
    assert isinstance(first, fork_server.Forked)
    assert (first.wait(60), second.wait(60)) == (3, 0)
    one, two = seen(out1), seen(out2)
    assert one["sqlalchemy"] and one["preloaded"] == [] and two["preloaded"] == []
    assert (one["env"], two["env"]) == ("one", "two")
    assert one["cwd"] == str(tmp_path) and one["path0"] == str(tmp_path)
    assert one["argv"] == ["3"] and one["session_leader"]


def test_a_killed_process_reports_its_signal_and_a_session_dies_whole(tmp_path: Path) -> None:
    # Given a launched process that runs until it is stopped
    proc, out = launch(tmp_path, "sleep")
    wait_for(lambda: out.read_text().strip(), 30, what="the probe's line")
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(0.1)
    # When its session is SIGKILLed, as Fleet.kill does
    os.killpg(proc.pid, signal.SIGKILL)
    # Then its status says the signal, as Popen's would
    assert proc.wait(30) == -signal.SIGKILL and proc.returncode == -signal.SIGKILL


def test_a_launch_the_server_cannot_reproduce_starts_a_real_process(tmp_path: Path) -> None:
    # Given a launch with another hash seed (read by the interpreter at start-up) and one with the
    # fork server turned off
    seeded, out1 = launch(tmp_path, "0", PYTHONHASHSEED="123")
    off, out2 = launch(tmp_path, "0", PHOTOJOBS_TEST_FORK="0")
    # Then both are real processes that import everything themselves
    assert isinstance(seeded, subprocess.Popen) and isinstance(off, subprocess.Popen)
    assert seeded.wait(60) == 0 and off.wait(60) == 0
    assert not seen(out1)["sqlalchemy"] and not seen(out2)["sqlalchemy"]


def test_run_captures_both_outputs_and_the_status_of_a_cli_command(tmp_path: Path) -> None:
    # Given the CLI launched through the fork server with a verb it does not know
    done = fork_server.run(
        [sys.executable, "-m", "photojobs", "no-such-verb"], env=dict(os.environ), cwd=tmp_path, timeout=60
    )
    # Then its usage error and status come back as subprocess.run's would
    assert done.returncode == 2 and "No such command 'no-such-verb'" in done.stderr and done.stdout == ""


def test_output_to_devnull_is_forked_and_to_a_pipe_is_a_real_process(tmp_path: Path) -> None:
    # Given a launch whose output goes nowhere, and one whose output is a pipe (not passed on)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    nowhere = subprocess.DEVNULL
    argv = [sys.executable, "-m", PROBE]
    quiet = fork_server.popen([*argv, "4"], env=env, cwd=ROOT, stdout=nowhere, stderr=nowhere)
    piped = fork_server.popen([*argv, "0"], env=env, cwd=ROOT, stdout=subprocess.PIPE)
    # Then the first is forked and says its status; the second is a real process whose pipe is read
    assert isinstance(quiet, fork_server.Forked) and quiet.wait(60) == 4
    assert isinstance(piped, subprocess.Popen)
    out, _ = piped.communicate(timeout=60)
    assert piped.returncode == 0 and json.loads(out)["sqlalchemy"] is False


def test_a_new_sessions_group_exists_as_soon_as_the_launch_returns(tmp_path: Path) -> None:
    # Given launches in sessions of their own (as Fleet starts workers), each signalled at once
    # (the shared fleet SIGSTOPs a worker group right after starting it: ProcessLookupError, once)
    for _ in range(10):
        proc, _out = launch(tmp_path, "sleep")
        # When its group is signalled the moment the launch returns
        os.killpg(proc.pid, signal.SIGKILL)  # Then it exists (Popen returns after the setsid too)
        assert proc.wait(30) == -signal.SIGKILL
