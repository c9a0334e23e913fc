"""Large submissions: ``Client.submit(["noop"], [folder of N empty files])`` on each store.

Runs in a child process (``python -m benchmarks.submit_child``) so its peak RSS is its own:
``os.wait4`` returns the child's ``ru_maxrss``. Reports the wall time, its split between walking the
folder and the store transaction, the peak RSS (and its growth over the RSS after imports), and the
CPU per 1,000 photos of the submitting process and (PostgreSQL) of the database's backends, sampled
from ``/proc`` while the child runs (load-proof, unlike the wall time).
"""

from __future__ import annotations

import json
import os
import sys
import time

from .harness import BenchContext, BenchmarkError, StoreUnavailable, command_line, wait_for
from .reader import Reader
from .registry import Row, register

NAME = "submit"


def _run_child(
    ctx: BenchContext, url: str, folder: str, timeout: float
) -> tuple[dict[str, float], int, float]:
    """Run the child; returns (its JSON, its peak RSS in KiB, the wall time seen by the parent). The
    JSON gains ``cpu_s`` (the child's) and ``backends_cpu_s`` (PostgreSQL's backends of the database)."""
    from .million import CpuTracker

    cmd = [sys.executable, "-m", "benchmarks.submit_child", url, folder]
    ctx.note(command="submit: " + command_line(cmd))
    reader = Reader(url) if url.startswith("postgresql") else None
    tracker = CpuTracker({"backends": (lambda: _backends(reader)) if reader else list})
    tracker.start()
    t0 = time.perf_counter()
    proc = ctx.procs.spawn("submit", cmd, ctx.photojobs_env(url))
    deadline = time.monotonic() + timeout
    next_sample = 0.0
    try:
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                ctx.procs.kill(proc)
                raise BenchmarkError(f"submission did not finish in {timeout:.0f}s")
            if time.monotonic() >= next_sample:  # each sample is a query: not at every poll
                tracker.sample()
                next_sample = time.monotonic() + 0.1
            time.sleep(0.02)
    finally:
        if reader:
            reader.close()
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped by wait4, so Popen cannot see it
    log = ctx.procs.tail(proc, 100_000)
    if proc.returncode != 0:
        raise BenchmarkError(f"submit child exited with {proc.returncode}: {log[-2000:]}")
    lines = [line for line in log.splitlines() if line.startswith("{")]
    if not lines:
        raise BenchmarkError(f"submit child printed no result: {log[-2000:]}")
    data = json.loads(lines[-1])
    data["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)
    data["backends_cpu_s"] = tracker.totals()["backends"]
    return data, int(usage.ru_maxrss), wall


def _backends(reader: Reader) -> list[int]:
    """The database's PostgreSQL backends but the reader's own."""
    sql = "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    return [r[0] for r in reader.rows(sql)]


@register(NAME, "Submission of a large folder: time and peak RSS of the submitting process")
def submission(ctx: BenchContext) -> list[Row]:
    """``--submit-items`` empty files, submitted once per store."""
    cfg = ctx.config
    n = cfg.submit_items
    ctx.note(settings={"files": n, "lanes": "noop", "child": "python -m benchmarks.submit_child (cwd repo)"})
    t0 = time.perf_counter()
    folder = ctx.folder("submit", n)
    made = time.perf_counter() - t0
    rows: list[Row] = []
    for store in cfg.stores:
        case = f"{store}, {n} files"
        try:
            url = ctx.dbs.create(store, "submit")
        except StoreUnavailable as exc:
            rows.append(Row(NAME, case, "Client.submit", None, verdict="skipped", note=str(exc)))
            continue
        try:
            data, peak_kib, wall = _run_child(ctx, url, str(folder), timeout=60 + n / 100)
            with Reader(url) as reader:
                items = wait_for(lambda r=reader: r.scalar("SELECT count(*) FROM items"), 5, what="items")
        finally:
            ctx.dbs.drop(url)
        if items != n or data["items"] != n:
            raise BenchmarkError(f"{store}: expected {n} items, the store holds {items}")
        rate = n / data["submit_s"]
        rows += [
            Row(
                NAME,
                case,
                "Client.submit wall time",
                round(data["submit_s"], 2),
                "s",
                note=f"{rate:,.0f} items/s; walk {data.get('collect_s', 0):.2f} s, store transaction "
                f"{data.get('store_submit_s', 0):.2f} s",
                detail={**data, "child_wall_s": round(wall, 2)},
            ),
            Row(
                NAME,
                case,
                "CPU s per 1,000 photos (submitter + backends)",
                round(1000 * (data["cpu_s"] + data["backends_cpu_s"]) / n, 4),
                "s",
                note=f"submitter {1000 * data['cpu_s'] / n:.4f}, PostgreSQL backends "
                f"{1000 * data['backends_cpu_s'] / n:.4f} (SQLite: in the submitter)",
            ),
            Row(
                NAME,
                case,
                "peak RSS of the submitting process",
                round(peak_kib / 1024, 1),
                "MiB",
                note=f"{(peak_kib - data['rss_before_submit_kib']) / 1024:.1f} MiB above the RSS "
                "after imports",
                detail={"ru_maxrss_kib": peak_kib, "rss_before_submit_kib": data["rss_before_submit_kib"]},
            ),
        ]
    ctx.note(settings={"creating the files took (s)": round(made, 2)})
    return rows
