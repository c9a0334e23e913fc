"""The diagnostic lane ``noop``: touches no file. Used by ``make bench`` and deployment checks.

Parameters (all optional): ``noop.sleep`` seconds to wait (checking for stop requests),
``noop.spin`` seconds of pure-Python CPU work (no checks: proves the heartbeat is not starved),
``noop.crash_if`` a substring: an item whose photo path contains it kills its worker process
(SIGKILL), ``noop.fail_if`` a substring: such items raise an error.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from middleware import failpoints
from middleware.context import ItemContext

from .lane import lane_actor


def _spin(seconds: float) -> int:
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        for i in range(10_000):
            n += i * i % 7
    return n


@lane_actor("noop")
def noop(ctx: ItemContext) -> dict[str, Any]:
    path = ctx.photo_path or ""
    crash_if = ctx.param("noop.crash_if")
    if crash_if and crash_if in path:
        os.kill(os.getpid(), signal.SIGKILL)
    fail_if = ctx.param("noop.fail_if")
    if fail_if and fail_if in path:
        raise RuntimeError(f"noop.fail_if matched {path}")
    spin = float(ctx.param("noop.spin", 0) or 0)
    if spin:
        _spin(spin)
    sleep = float(ctx.param("noop.sleep", 0) or 0)
    checkpoint = ctx.saved_checkpoint or {}
    slept = float(checkpoint.get("slept", 0.0))
    step = 0.05
    while slept < sleep:
        ctx.check()
        time.sleep(min(step, sleep - slept))
        slept += min(step, sleep - slept)
        if int(slept / 0.5) != int((slept - step) / 0.5):
            ctx.checkpoint({"slept": slept})
    ctx.check()
    failpoints.hit("noop.before_commit")
    return {"slept": sleep, "resumed_from": checkpoint.get("slept"), "attempt": ctx.attempt}
