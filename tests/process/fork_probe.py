"""Run through tests/fork_server.py by test_fork_server.py: what the launched process sees.

Prints one JSON line (the project's and Dramatiq's modules imported before this one ran, the
environment variable PJ_PROBE, the working folder, argv, session) and exits with the status its
first argument names (or sleeps forever when it is ``sleep``)."""

from __future__ import annotations

import json
import os
import sys
import time

PROJECT = ("actors", "middleware", "store", "photos", "photojobs", "dramatiq", "prometheus_client")
seen = sorted(n for n in sys.modules if n.split(".")[0] in PROJECT)
print(
    json.dumps(
        {
            "preloaded": seen,
            "sqlalchemy": "sqlalchemy" in sys.modules,
            "env": os.environ.get("PJ_PROBE"),
            "cwd": os.getcwd(),
            "argv": sys.argv[1:],
            "session_leader": os.getsid(0) == os.getpid(),
            "path0": sys.path[0],
        }
    ),
    flush=True,
)
if sys.argv[1:2] == ["sleep"]:
    while True:
        time.sleep(1)
sys.exit(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
