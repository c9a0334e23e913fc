"""Child process of the submission benchmark: one ``Client.submit(["noop"], [folder])``, timed.

``python -m benchmarks.submit_child DATABASE_URL FOLDER`` prints one JSON line: the wall time of
``Client.submit`` and its parts (walking the folder, the store transaction), the items written,
and the process's RSS before the submission. The parent reads the peak RSS from ``wait4``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _timed(parts: dict[str, float], name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            parts[name] = parts.get(name, 0.0) + time.perf_counter() - t0

    return wrapper


def main(argv: list[str]) -> int:
    """Submit the folder to the database and print the timings as JSON."""
    url, folder = argv
    from photojobs import api
    from photojobs.config import Settings
    from store import jobs as store_jobs

    parts: dict[str, float] = {}
    # Instrument this process only: the walk and the store transaction, inside Client.submit.
    api.scan_photos = _timed(parts, "collect_s", api.scan_photos)  # type: ignore[assignment]
    store_jobs.submit = _timed(parts, "store_submit_s", store_jobs.submit)  # type: ignore[assignment]
    client = api.Client(Settings.from_env({"PHOTOJOBS_DATABASE_URL": url}), migrate=False)
    rss_before = _rss_kib()
    t0 = time.perf_counter()
    result = client.submit(["noop"], [folder])
    total = time.perf_counter() - t0
    client.engine.dispose()
    out = {
        "submit_s": total,
        "items": result.items,
        "photos": result.photos,
        "rss_before_submit_kib": rss_before,
        **parts,
    }
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
