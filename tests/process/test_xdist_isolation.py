"""make test runs on pytest-xdist workers: each worker gets its own Redis server, PostgreSQL template,
lockdep folder and tmp dir (tests/conftest.py), proven by a real two-worker pytest run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT


def test_two_xdist_workers_share_no_redis_template_lockdep_folder_or_tmp_dir(tmp_path: Path) -> None:
    # Given a lockdep folder named in the environment (as a developer may set it for a whole run)
    # and two xdist workers that each run the probe test (--dist each)
    out = tmp_path / "records"
    out.mkdir()
    given_lockdep = tmp_path / "lockdep"
    given_lockdep.mkdir()
    env = {**os.environ, "PJ_XDIST_PROBE_OUT": str(out), "PHOTOJOBS_LOCKDEP": str(given_lockdep)}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_TESTRUNUID", None)
    # When the probe runs
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "each",
         "--basetemp", str(tmp_path / "basetemp"), "tests/process/xdist_probe.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=280,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    # Then each worker recorded its resources, and no two share a Redis port or folder, a
    # PostgreSQL template, a lockdep folder or a tmp dir
    records = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    assert sorted(r["worker"] for r in records) == ["gw0", "gw1"], records
    for key in ("redis_port", "redis_dir", "template", "lockdep", "tmp"):
        values = [r[key] for r in records]
        assert None not in values and len(set(values)) == 2, f"{key} shared by the workers: {records}"
    # And the given lockdep folder holds one sub-folder per worker
    assert sorted(Path(r["lockdep"]).relative_to(given_lockdep).as_posix() for r in records) == ["gw0", "gw1"]
