"""``make demo``'s last lines name the next two commands — the status of its job and the console on
its store — and both work as printed (run from the demo's own folder, as a fresh clone does)."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import httpx

from tests.support import ROOT, free_port, wait_for


def test_the_demo_ends_with_two_commands_that_work(tmp_path: Path, redis_url: str) -> None:
    # Given a fresh folder / When a small demo runs in it (its own SQLite store in .photojobs)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PHOTOJOBS_REDIS_URL": redis_url}
    demo = subprocess.run(
        [sys.executable, "-m", "photojobs.demo", "--dir", "demo-photos", "--count", "6", "--workers", "1"],
        cwd=tmp_path,
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
    # Then its output ends with the two next commands
    last = demo.stdout.strip().splitlines()[-3:]
    assert last[0] == "next:", demo.stdout[-2000:]
    status_cmd, serve_cmd = (shlex.split(line.split("#")[0]) for line in last[1:])
    assert status_cmd[1:] == ["status", "--state-dir", ".photojobs"]
    assert serve_cmd[1:] == ["serve", "--state-dir", ".photojobs", "--insecure-local"]
    # And the status command shows the demo's job
    status = subprocess.run(status_cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and status.stdout.startswith("job 1: "), status.stdout + status.stderr
    # And the serve command serves the console on the demo's store
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    proc = subprocess.Popen([*serve_cmd, "--port", str(port)], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            try:
                return httpx.get(url + "/", timeout=5).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(up, 60, 0.2, what="the console of the demo's store")
        jobs = httpx.get(url + "/api/jobs", timeout=10).json()["jobs"]
        assert [j["job"] for j in jobs] == [1]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # And a read-only command elsewhere creates no store: one line says how to point at one
    elsewhere = subprocess.run(
        [status_cmd[0], "jobs"],
        cwd=tmp_path / "demo-photos",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert elsewhere.returncode == 69 and "--state-dir" in elsewhere.stderr
    assert len(elsewhere.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "demo-photos" / "photojobs.db").exists()
