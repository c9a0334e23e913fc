"""``python -m benchmarks --quick``: the smoke run of the benchmarks inside ``make test``.

It runs every goal row of issue 9 at small sizes against real Redis, SQLite, PostgreSQL and real
worker processes. Speed is not asserted (that is ``make bench``'s job): only that every goal row is
printed with a number, a baseline and a verdict, and that the results go to the given path.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import PG_ADMIN
from tests.support import ROOT

GOAL_FIGURES = (
    "no-op items/s, sqlite",
    "no-op items/s, postgresql",
    "store CPU per item",
    "SQLite write lock held per item, loaded",
    "SQLite write lock held per item, idle",
    "analysis photos/s vs Pool(2)",
    "worker CPU per photo vs the pool's",
    "SIGKILL -> running again",
)
NUMBER_THEN_VERDICT = re.compile(r"\d[\d,]*\.?\d*\s*[a-z/]*\s*│.*│\s*(met|missed)\s*│")


def test_quick_bench_prints_every_goal_row_with_a_number_and_a_verdict(
    tmp_path: Path, pg_template: str
) -> None:
    # Given a results path outside the repository and the test PostgreSQL server
    output = tmp_path / "results.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOTOJOBS_", "PJBENCH_", "dramatiq_"))}
    env["COLUMNS"] = "250"

    # When the quick benchmark runs
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--pg-admin", PG_ADMIN, "--output", str(output)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )

    # Then it completes, and every goal row is printed with its number and a verdict
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    for figure in GOAL_FIGURES:
        found = [line for line in lines if figure in line]
        assert found, f"goal row {figure!r} is not printed:\n{proc.stdout}"
        assert NUMBER_THEN_VERDICT.search(found[0]), f"goal row without a number or verdict: {found[0]}"

    # And the results file holds the goal rows first, each with a value, a baseline, a ratio and a verdict
    data = json.loads(output.read_text())
    assert data["mode"] == "quick"
    assert next(iter(data["benchmarks"])) == "goals"
    rows = [r for r in data["benchmarks"]["goals"]["rows"] if r["goal"]]
    for figure in GOAL_FIGURES:
        row = next((r for r in rows if r["figure"].startswith(figure)), None)
        assert row is not None, f"{figure!r} missing from {output}"
        assert isinstance(row["value"], int | float), row
        assert row["verdict"] in ("met", "missed"), row
        assert row["baseline"] and row["ratio"] is not None and row["load"], row
