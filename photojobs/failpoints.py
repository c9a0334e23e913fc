"""Test-only failpoints: ``PHOTOJOBS_FAILPOINTS=rename.after_record,exif.after_apply`` makes the
worker process SIGKILL itself when it reaches one of the named step boundaries."""

from __future__ import annotations

import os
import signal


def hit(name: str) -> None:
    names = os.environ.get("PHOTOJOBS_FAILPOINTS", "")
    if names and name in {n.strip() for n in names.split(",")}:
        os.kill(os.getpid(), signal.SIGKILL)
