"""Child process of the analysis benchmark: the baseline, ``Pool(P).map(analyze, paths)``, timed.

``python -m benchmarks.analysis_pool PROCESSES FOLDER`` analyses every file of ``FOLDER`` (sorted,
as ``Client.submit`` orders them) with ``photos.analyze.analyze`` in a plain ``multiprocessing.Pool``
and prints one JSON line: the photos, the wall time of the ``map`` call, the CPU seconds this
process group (this process and the pool's workers) and the whole machine spent in it. The pool is
started and warmed (a ``map`` over a few photos) before the timed call, as photojobs' workers are
started and warmed before its timed job.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

from photos.analyze import analyze  # imported before the fork: the pool's workers inherit it

from . import cpu


def main(argv: list[str]) -> int:
    """Run the pool over the folder and print the timings as JSON."""
    processes, folder = int(argv[0]), Path(argv[1])
    paths = sorted(str(p) for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    group = {"pool": [os.getpgrp()]}
    with multiprocessing.Pool(processes) as pool:
        pool.map(analyze, paths[: 2 * processes], chunksize=1)
        before, busy_before = cpu.snapshot(group), cpu.machine_busy()
        t0 = time.perf_counter()
        results = pool.map(analyze, paths)
        seconds = time.perf_counter() - t0
        after, busy_after = cpu.snapshot(group), cpu.machine_busy()
    if len(results) != len(paths) or not all(r.get("sha256") for r in results):
        raise SystemExit(f"expected {len(paths)} analyses, got {len(results)}")
    print(
        json.dumps(
            {
                "photos": len(paths),
                "seconds": seconds,
                "cpu_s": after["pool"] - before["pool"],
                "machine_busy_s": busy_after - busy_before,
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
