"""The exit codes of ``photojobs run`` and the job states after which it has nothing to wait for."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED_ITEMS = 1
EXIT_INTERRUPTED = 130
EXIT_TEMPFAIL = 75
EXIT_WORKERS_FAILED = 3
FINAL = {"succeeded", "failed", "partial", "cancelled"}
