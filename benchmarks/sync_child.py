"""Child process of the sync benchmark: one ``Client.sync(["analysis"], [FOLDER])``, measured.

``python -m benchmarks.sync_child DATABASE_URL FOLDER`` prints one JSON line: the wall and CPU time
of the sync, the statements it sent to the database (SQLAlchemy's ``before_cursor_execute``: an
``executemany`` is one), the files it hashed, its report, the RSS after the imports and the peak
RSS (``VmHWM``) at the end. ``--walk-only``: only walk the folder with ``os.scandir`` and
``stat`` every file (the floor a no-change sync cannot go under).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def _rss_kib(field: str = "VmRSS") -> int:
    """This process's RSS (``VmRSS``) or its peak (``VmHWM``; not ``ru_maxrss``, which Linux keeps
    across ``execve`` from the parent that forked it), in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    return 0


def walk_only(folder: str) -> dict[str, Any]:
    t0, c0 = time.perf_counter(), time.process_time()
    n, stack = 0, [folder]
    while stack:
        with os.scandir(stack.pop()) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                else:
                    e.stat(follow_symlinks=False)
                    n += 1
    return {"files": n, "wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}


def main(argv: list[str]) -> int:
    if argv[0] == "--walk-only":
        print(json.dumps(walk_only(argv[1])))
        return 0
    url, folder = argv
    from sqlalchemy import event

    import photojobs.sync as sync_module
    import photos.upload  # noqa: F401 - imported by the first job check of a process (boto3): not the sync's
    from photojobs.api import Client
    from photojobs.config import Settings

    client = Client(
        Settings.from_env({"PHOTOJOBS_DATABASE_URL": url, "PHOTOJOBS_REDIS_URL": "redis://127.0.0.1:1/0"}),
        migrate=False,
    )
    statements = [0]

    @event.listens_for(client.engine, "before_cursor_execute")
    def _count(*_args: Any) -> None:
        statements[0] += 1

    hashed = [0]
    real = sync_module._hash_fd

    def counting(fd: int) -> str:
        hashed[0] += 1
        return real(fd)

    sync_module._hash_fd = counting  # type: ignore[assignment]
    rss_before = _rss_kib()
    t0, c0 = time.perf_counter(), time.process_time()
    report = client.sync(["analysis"], [folder])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    out = {
        "wall_s": wall,
        "cpu_s": cpu,
        "statements": statements[0],
        "hashed": hashed[0],
        "rss_before_kib": rss_before,
        "peak_rss_kib": _rss_kib("VmHWM"),
        "report": {
            k: v for k, v in report.as_dict().items() if k not in ("left_out", "moves", "missing_paths")
        },
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
