"""Test-only failpoints at the step boundaries of the file-effect protocol.

``PHOTOJOBS_FAILPOINTS=rename.after_record,exif.after_stage:stop`` makes the worker process SIGKILL
itself (or, with ``:stop``, SIGSTOP itself — a frozen worker) when it reaches a named boundary.
"""

from __future__ import annotations

import os
import signal
import time


def hit(name: str) -> None:
    spec = os.environ.get("PHOTOJOBS_FAILPOINTS", "")
    if not spec:
        return
    for entry in spec.split(","):
        point, _, action = entry.strip().partition(":")
        if point != name:
            continue
        if action == "stop":
            from middleware.heartbeat import BEAT_LOCK

            with BEAT_LOCK:  # freeze outside any heartbeat transaction
                os.kill(os.getpid(), signal.SIGSTOP)
                # The group stop reaches this thread asynchronously: stay put (not running into a
                # transaction) until it has; after SIGCONT the sleep simply ends.
                time.sleep(1.0)
        else:
            os.kill(os.getpid(), signal.SIGKILL)
