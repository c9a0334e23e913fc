"""Issue 41: ``photojobs serve`` on a port another process holds exits 75 (try again later) naming
the port and the option, instead of a late crash read as "workers kept crashing" (exit 3). A real
``python -m photojobs serve`` process, a real listening socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from tests.web_support import TOKEN


def test_serve_on_a_taken_port_exits_75_naming_the_port(tmp_path: Path) -> None:
    """Given a port some other process listens on
    When ``photojobs serve --port P`` starts
    Then it exits 75 saying ``port P is in use: --port``, before starting anything."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = {
            **os.environ,
            "PHOTOJOBS_API_TOKEN": TOKEN,
            "PHOTOJOBS_DATABASE_URL": f"sqlite:///{tmp_path / 'p.db'}",
        }
        done = subprocess.run(
            [sys.executable, "-m", "photojobs", "serve", "--port", str(port)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 75, (done.returncode, done.stderr)
    assert f"port {port} is in use: --port" in done.stderr
