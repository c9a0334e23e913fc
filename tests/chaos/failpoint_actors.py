"""The ``actors`` broker module with failpoints armed on a random fraction of their hits (test only).

``middleware.failpoints.hit`` fires on *every* hit of a named boundary, so a worker started with
``PHOTOJOBS_FAILPOINTS`` dies at its first item. The photo chaos run starts some workers as
``dramatiq tests.chaos.failpoint_actors`` instead of ``dramatiq actors``: the same broker, lanes and
middleware, but each hit of an armed boundary fires only with probability
``PHOTOJOBS_CHAOS_FAILPOINT_RATE`` (seeded by ``PHOTOJOBS_CHAOS_FAILPOINT_SEED``), so the worker runs
a few items normally and then dies (SIGKILL) or freezes (``:stop``, SIGSTOP) at a boundary of one.
Each firing is appended to ``PHOTOJOBS_CHAOS_FAILPOINT_LOG`` (one ``pid boundary action`` line)
before it happens, so the run can count the faults it injected per boundary.
"""

from __future__ import annotations

import os
import random

from middleware import failpoints

_real_hit = failpoints.hit
_rate = float(os.environ.get("PHOTOJOBS_CHAOS_FAILPOINT_RATE", "0") or 0)
_rng = random.Random(f"{os.environ.get('PHOTOJOBS_CHAOS_FAILPOINT_SEED', '')}:{os.getpid()}")
_log = os.environ.get("PHOTOJOBS_CHAOS_FAILPOINT_LOG", "")


def _armed(name: str) -> str | None:
    """The action (``kill`` or ``stop``) armed for boundary ``name``, or None."""
    for entry in os.environ.get("PHOTOJOBS_FAILPOINTS", "").split(","):
        point, _, action = entry.strip().partition(":")
        if point == name:
            return action or "kill"
    return None


def hit(name: str) -> None:
    action = _armed(name)
    if action is None or _rng.random() >= _rate:
        return
    if _log:
        fd = os.open(_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{os.getpid()} {os.getpgid(0)} {name} {action}\n".encode())
        finally:
            os.close(fd)
    _real_hit(name)


failpoints.hit = hit

from actors import broker  # noqa: E402  (the real broker, lanes and middleware)

__all__ = ["broker"]
