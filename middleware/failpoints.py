"""Test-only failpoints at the step boundaries of the file-effect protocol.

``PHOTOJOBS_FAILPOINTS=rename.after_record,exif.after_stage:stop`` makes the worker process SIGKILL
itself (or, with ``:stop``, SIGSTOP itself — a frozen worker — outside any heartbeat transaction;
with ``:freeze``, SIGSTOP at once, whatever it holds) when it reaches a named boundary.
With ``:wait`` it pauses there instead: it creates ``{name}.reached`` in ``PHOTOJOBS_FAILPOINT_DIR``
and goes on once ``{name}.go`` appears there (a test changes the disk inside the gap meanwhile).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

#: How long a ``:wait`` failpoint waits for its ``.go`` file before going on anyway.
WAIT_LIMIT = 300.0


def hit(name: str) -> None:
    spec = os.environ.get("PHOTOJOBS_FAILPOINTS", "")
    if not spec:
        return
    for entry in spec.split(","):
        point, _, action = entry.strip().partition(":")
        if point != name:
            continue
        if action == "wait":
            _wait(name)
        elif action == "freeze":
            # Frozen where it stands, whatever the process holds: a finish's open transaction
            # (``finish.before_commit``), while the heartbeat may be waiting for its lock.
            os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(1.0)
        elif action == "stop":
            from middleware.heartbeat import BEAT_LOCK

            with BEAT_LOCK:  # freeze outside any heartbeat transaction
                os.kill(os.getpid(), signal.SIGSTOP)
                # The group stop reaches this thread asynchronously: stay put (not running into a
                # transaction) until it has; after SIGCONT the sleep simply ends.
                time.sleep(1.0)
        else:
            os.kill(os.getpid(), signal.SIGKILL)


def _wait(name: str) -> None:
    folder = os.environ.get("PHOTOJOBS_FAILPOINT_DIR")
    if not folder:
        raise RuntimeError(f"failpoint {name}:wait needs PHOTOJOBS_FAILPOINT_DIR")
    (Path(folder) / f"{name}.reached").touch()
    go = Path(folder) / f"{name}.go"
    deadline = time.monotonic() + WAIT_LIMIT
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)  # the worker polls; the test releases it by creating the file
