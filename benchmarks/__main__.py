"""``python -m benchmarks``: run the registered benchmarks, print a table, write ``results.json``.

The ``goals`` benchmark runs first: every goal row of issue 9 with its figure, the baseline measured
in the same run, the ratio, the goal, the verdict and the machine's load during the measurement.

Sizes come from flags, else ``PJBENCH_*`` variables, else the defaults (``--quick`` shrinks them for
CI smoke runs: 60 items, 2000 submitted files, 40 photos (8 for the goal rows), one recovery
repetition, and runs only ``goals`` unless benchmarks are named)::

    python -m benchmarks                                  # everything (by default), full size
    python -m benchmarks --items 2000 --processes 2 --threads 4 --only goals,shapes
    python -m benchmarks --only locks,analysis            # updates those two in results.json
    python -m benchmarks --quick                          # the goal rows, small: < 60 s
    python -m benchmarks scale                            # one benchmark by name (= --only scale)
    python -m benchmarks --list

A run of some benchmarks (``--only``) into an existing results file replaces their entries and
keeps the others (each entry records the run it came from).

Exit status: 0 when every benchmark ran (goals met or not), 1 when one failed, 130 when interrupted.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from .harness import DEFAULT_PG_ADMIN, ROOT, STORES, BenchContext, Config
from .registry import PLANNED, Row, load_all

HERE = Path(__file__).resolve().parent

FULL = {"items": 2000, "submit_items": 100_000, "repetitions": 3, "photos": 300}
QUICK = {"items": 60, "submit_items": 2000, "repetitions": 1, "photos": 40}
QUICK_DEFAULT = ("goals",)  # what --quick runs unless --only / names say otherwise


def _env_int(name: str) -> int | None:
    raw = os.environ.get(name)
    return int(raw) if raw else None


def _csv(text: str | None) -> list[str]:
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def parse_args(argv: Sequence[str] | None = None) -> tuple[Config, argparse.Namespace]:
    """The run's ``Config`` from flags, then ``PJBENCH_*`` variables, then the (quick) defaults."""
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--quick",
        action="store_true",
        help="CI smoke run: the goal rows only (unless named), 60 items, 8 photos, 1 rep.",
    )
    p.add_argument("--items", type=int, help="N for the throughput runs [PJBENCH_ITEMS; 2000].")
    p.add_argument("--processes", type=int, help="worker processes P [PJBENCH_PROCESSES; 2].")
    p.add_argument("--threads", type=int, help="threads per worker process T [PJBENCH_THREADS; 4].")
    p.add_argument(
        "--submit-items", type=int, help="files in the submission run [PJBENCH_SUBMIT_ITEMS; 100000]."
    )
    p.add_argument("--repetitions", type=int, help="recovery repetitions [PJBENCH_REPETITIONS; 3].")
    p.add_argument("--photos", type=int, help="sample photos in the analysis run [PJBENCH_PHOTOS; 300].")
    p.add_argument(
        "--bound", type=int, help="PHOTOJOBS_LANE_NOOP_BOUND for the throughput run [default 2*T*P]."
    )
    p.add_argument("--stores", help=f"stores to run [PJBENCH_STORES; {','.join(STORES)}].")
    p.add_argument("--only", help="comma-separated benchmark names [PJBENCH_ONLY; all].")
    p.add_argument("--pg-admin", help=f"PostgreSQL admin URL [PJBENCH_PG_ADMIN; {DEFAULT_PG_ADMIN}].")
    p.add_argument(
        "--output", type=Path, help="results file [benchmarks/results.json; -quick.json with --quick]."
    )
    p.add_argument("--keep", action="store_true", help="keep the work dir (databases, logs) for inspection.")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit.")
    p.add_argument("names", nargs="*", help="benchmarks to run (the same as --only NAME,...).")
    a = p.parse_args(argv)
    sizes = QUICK if a.quick else FULL

    def pick(flag: int | None, env: str, default: int) -> int:
        value = flag if flag is not None else _env_int(env)
        return default if value is None else value

    cfg = Config(
        items=pick(a.items, "PJBENCH_ITEMS", sizes["items"]),
        processes=pick(a.processes, "PJBENCH_PROCESSES", 2),
        threads=pick(a.threads, "PJBENCH_THREADS", 4),
        submit_items=pick(a.submit_items, "PJBENCH_SUBMIT_ITEMS", sizes["submit_items"]),
        repetitions=pick(a.repetitions, "PJBENCH_REPETITIONS", sizes["repetitions"]),
        photos=pick(a.photos, "PJBENCH_PHOTOS", sizes["photos"]),
        bound=pick(a.bound, "PJBENCH_BOUND", 0),
        stores=_csv(a.stores or os.environ.get("PJBENCH_STORES")) or list(STORES),
        only=list(a.names) + _csv(a.only or ("" if a.names else os.environ.get("PJBENCH_ONLY"))),
        quick=a.quick,
        keep=a.keep,
        pg_admin=a.pg_admin
        or os.environ.get("PJBENCH_PG_ADMIN")
        or os.environ.get("PHOTOJOBS_TEST_PG")
        or DEFAULT_PG_ADMIN,
    )
    bad = [s for s in cfg.stores if s not in STORES]
    if bad:
        p.error(f"unknown store(s) {', '.join(bad)}; stores are {', '.join(STORES)}")
    for name in ("items", "processes", "threads", "submit_items", "repetitions", "photos"):
        if getattr(cfg, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    return cfg, a


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


def _load1() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def _revision() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the selected benchmarks; print the table; write the results file; return the exit status."""
    cfg, args = parse_args(argv)
    registry = load_all()
    if args.list:
        for b in registry.values():
            print(f"{b.name:10} {b.title}")
        for name, what in PLANNED.items():
            print(f"{name:10} (planned) {what}")
        return 0
    unknown = [n for n in cfg.only if n not in registry]
    if unknown:
        print(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(registry)}", file=sys.stderr)
        return 2
    if cfg.only:
        selected = [registry[n] for n in cfg.only]
    elif cfg.quick:  # the smoke run of `make test`: every goal row, small sizes
        selected = [registry[n] for n in QUICK_DEFAULT]
    else:
        selected = [b for b in registry.values() if b.default]
    # Ctrl-C raises KeyboardInterrupt even if we were started with SIGINT ignored (a background job);
    # SIGTERM/SIGHUP raise SystemExit. Either way the ``finally`` below kills every child process group.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise_exit)

    from . import report

    started = time.time()
    load_start = _loadavg()
    rows: list[Row] = []
    failed = 0
    ctx = BenchContext(cfg)
    try:
        ctx.open()
        for bench in selected:
            ctx.current = bench.name
            t0 = time.monotonic()
            load0 = _load1()
            print(f"[benchmarks] {bench.name}: {bench.title} ...", file=sys.stderr, flush=True)
            try:
                got = bench.fn(ctx)
            except Exception as exc:  # noqa: BLE001 - report it and go on with the next benchmark
                traceback.print_exc()
                got = [Row(bench.name, "-", "did not complete", None, verdict="error", note=str(exc)[:500])]
            for r in got:  # rows that do not say their own load get the benchmark's
                r.load = r.load or f"load {load0}->{_load1()} (whole benchmark)"
            failed += any(r.verdict == "error" for r in got)
            rows += got
            print(f"[benchmarks] {bench.name}: {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        print("[benchmarks] interrupted; cleaning up", file=sys.stderr)
        return 130
    finally:
        ctx.close()
        if cfg.keep:
            print(f"[benchmarks] work dir kept: {ctx.workdir}", file=sys.stderr)

    argv_text = shlex.join(list(argv) if argv is not None else sys.argv[1:])
    meta: dict[str, Any] = {
        "mode": "quick" if cfg.quick else "full",
        "started": dt.datetime.fromtimestamp(started, dt.UTC).isoformat(timespec="seconds"),
        "duration_s": round(time.time() - started, 1),
        "command": f"python -m benchmarks {argv_text}".strip(),
        "revision": _revision(),
        "config": dataclasses.asdict(cfg),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "loadavg_start": load_start,
            "loadavg_end": _loadavg(),
        },
        "failed": failed,
    }
    titles = {b.name: b.title for b in selected}
    report.render(rows, ctx.notes, titles, meta)
    output = args.output or HERE / ("results-quick.json" if cfg.quick else "results.json")
    kept = report.write_json(output, rows, ctx.notes, titles, meta, keep_others=bool(cfg.only))
    print(
        f"\nresults written to {output}" + (f" (kept from earlier runs: {', '.join(kept)})" if kept else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
