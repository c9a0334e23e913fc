"""The analysis goal row A-B-A: this checkout against another revision's, alternating (issue 32).

``python -m benchmarks.aba_analysis OTHER_CHECKOUT [--rounds 3] [--photos 300]`` runs the analysis
goal row (``benchmarks.goals.analysis_rows``: ``Pool(2)``, ``photojobs worker --lanes analysis``,
``Pool(2)`` again on the same photos) of OTHER_CHECKOUT, then of this one, ``--rounds`` times, each
with its own virtualenv (``<checkout>/.venv``) and its own code, and prints every run and the
medians: photos/s against the pool's and the worker processes' CPU per photo against the pool's
(from ``/proc``; the machine's load moves it far less than the rates). Make the other checkout
with ``git worktree add ../million-base bc8cedf && (cd ../million-base && make venv)``.

``--one`` (internal): run the row once in the current directory's checkout and print it as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent


def one(photos: int) -> dict[str, Any]:
    """The analysis goal row of the checkout in the current directory (its own ``benchmarks``)."""
    sys.path.insert(0, os.getcwd())
    from benchmarks import goals
    from benchmarks.harness import BenchContext, Config

    ctx = BenchContext(Config(photos=photos))
    t0 = time.time()
    try:
        ctx.open()
        ctx.current = "goals"
        rows = goals.analysis_rows(ctx, {})
    finally:
        ctx.close()
    keys = ("figure", "value", "baseline", "ratio", "load", "note")
    return {"t": round(time.time() - t0, 1), "rows": [{k: getattr(r, k, None) for k in keys} for r in rows]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.aba_analysis", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("other", nargs="?", type=Path, help="the other revision's checkout (with its .venv)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--photos", type=int, default=300)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.photos)))
        return 0
    if a.other is None:
        p.error("name the other checkout")
    runs: list[tuple[str, dict[str, Any]]] = []
    for _ in range(a.rounds):
        for checkout in (a.other.resolve(), HERE):
            rev = subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], cwd=checkout, capture_output=True, text=True
            ).stdout.strip()
            out = subprocess.run(
                [
                    str(checkout / ".venv/bin/python"),
                    str(Path(__file__).resolve()),
                    "--one",
                    "--photos",
                    str(a.photos),
                ],
                cwd=checkout,
                capture_output=True,
                text=True,
                check=False,
            )
            lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
            if not lines:
                print(f"{rev}: no result\n{out.stderr[-2000:]}", file=sys.stderr)
                continue
            got = json.loads(lines[-1])
            rate, cpu = got["rows"][0], got["rows"][1]
            print(
                f"{rev:9} {rate['value']} photos/s vs {rate['baseline']} = {rate['ratio']}x; "
                f"CPU {cpu['value']} ms/photo vs {cpu['baseline']} = {cpu['ratio']}x; {rate['load']}",
                flush=True,
            )
            runs.append((rev, got))
    for rev in dict.fromkeys(r for r, _ in runs):
        mine = [g for r, g in runs if r == rev]
        rates = [g["rows"][0]["ratio"] for g in mine]
        cpus = [g["rows"][1]["ratio"] for g in mine]
        print(
            f"{rev}: {len(mine)} runs; photos/s vs the pool median {statistics.median(rates):.3f} "
            f"({min(rates):.3f}-{max(rates):.3f}); CPU per photo vs the pool median "
            f"{statistics.median(cpus):.3f} ({min(cpus):.3f}-{max(cpus):.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
