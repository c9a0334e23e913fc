"""The output: a table (rich) of every row, the settings and commands, and ``results.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from .harness import Notes
from .registry import Row

GOALS = "goals"  # the benchmark whose rows with a goal lead the output (benchmarks.goals)
VERDICT_STYLE = {"met": "green", "missed": "bold red", "skipped": "yellow", "error": "bold red"}


def _value(row: Row) -> str:
    if row.value is None:
        return "-"
    if isinstance(row.value, float):
        text = f"{row.value:,.3f}" if abs(row.value) < 10 else f"{row.value:,.1f}"
    else:
        text = str(row.value) if not isinstance(row.value, int) else f"{row.value:,}"
    return f"{text} {row.unit}".strip()


def console() -> Console:
    """A console that does not squeeze the table when the output is a file or a pipe."""
    return Console(width=None if sys.stdout.isatty() else 240, highlight=False, soft_wrap=False)


def render(
    rows: list[Row],
    notes: dict[str, Notes],
    titles: dict[str, str],
    meta: dict[str, Any],
    out: Console | None = None,
) -> None:
    """Print the results table, then each benchmark's settings and commands."""
    out = out or console()
    goal_rows = [r for r in rows if r.benchmark == GOALS and r.goal]
    if goal_rows:
        goals = Table(title="Goals of issue 9 (each against a baseline measured in this run)")
        for col, kw in (
            ("Figure", {"no_wrap": True}),
            ("Value", {"justify": "right", "no_wrap": True}),
            ("Baseline (same run)", {"overflow": "fold"}),
            ("Ratio", {"justify": "right", "no_wrap": True}),
            ("Goal", {"no_wrap": True}),
            ("Verdict", {"no_wrap": True}),
            ("Load during the measurement", {"overflow": "fold"}),
        ):
            goals.add_column(col, **kw)  # type: ignore[arg-type]
        for row in goal_rows:
            style = VERDICT_STYLE.get(row.verdict, "")
            goals.add_row(
                row.figure,
                _value(row),
                row.baseline or "-",
                "-" if row.ratio is None else f"{row.ratio:.3f}x",
                row.goal,
                f"[{style}]{row.verdict}[/]" if style else row.verdict,
                row.load or "-",
            )
        out.print(goals)
        rows = [r for r in rows if not (r.benchmark == GOALS and r.goal)]
    table = Table(
        title=f"photojobs benchmarks ({meta['mode']}, {meta['duration_s']:.0f} s)", show_lines=False
    )
    for col, kw in (
        ("Benchmark", {"no_wrap": True}),
        ("Case", {"no_wrap": True}),
        ("Figure", {}),
        ("Value", {"justify": "right", "no_wrap": True}),
        ("Baseline", {"overflow": "fold"}),
        ("Ratio", {"justify": "right", "no_wrap": True}),
        ("Goal", {"no_wrap": True}),
        ("Verdict", {"no_wrap": True}),
        ("Load", {"overflow": "fold"}),
        ("Notes", {"overflow": "fold"}),
    ):
        table.add_column(col, **kw)  # type: ignore[arg-type]
    previous = None
    for row in rows:
        if previous is not None and previous != row.benchmark:
            table.add_section()
        previous = row.benchmark
        style = VERDICT_STYLE.get(row.verdict, "")
        table.add_row(
            row.benchmark,
            row.case,
            row.figure,
            _value(row),
            row.baseline,
            "" if row.ratio is None else f"{row.ratio:.3f}x",
            row.goal,
            f"[{style}]{row.verdict}[/]" if style else row.verdict,
            row.load,
            row.note,
        )
    out.print(table)
    out.print(
        f"machine: {meta['machine']['cpus']} CPUs, load average at start {meta['machine']['loadavg_start']}, "
        f"at end {meta['machine']['loadavg_end']}; python {meta['machine']['python']}"
    )
    out.print(f"command: {meta['command']}")
    for name, n in notes.items():
        out.print(f"\n[bold]{name}[/]: {titles.get(name, '')}")
        if n.settings:
            out.print("  settings: " + "; ".join(f"{k}={v}" for k, v in n.settings.items()))
        for c in n.commands:
            out.print(f"  $ {c}", markup=False)


RUN_KEYS = ("mode", "started", "duration_s", "command", "revision")


def write_json(
    path: Path,
    rows: list[Row],
    notes: dict[str, Notes],
    titles: dict[str, str],
    meta: dict[str, Any],
    *,
    keep_others: bool = False,
) -> list[str]:
    """``results.json``: the run's metadata, then per benchmark its run, settings, commands and rows.

    With ``keep_others`` (a run of some benchmarks, ``--only``), the entries of an existing file of
    the same mode for benchmarks this run did not run are kept, in their place, each with the run
    it came from. Returns the names of the entries kept.
    """
    run = {k: meta.get(k) for k in RUN_KEYS}
    fresh: dict[str, Any] = {}
    for row in rows:
        b = fresh.setdefault(row.benchmark, {"title": titles.get(row.benchmark, ""), "run": run, "rows": []})
        b["rows"].append(row.as_dict())
    for name, n in notes.items():
        b = fresh.setdefault(name, {"title": titles.get(name, ""), "run": run, "rows": []})
        b["settings"] = n.settings
        b["commands"] = n.commands
    old: dict[str, Any] = {}
    if keep_others and path.exists():
        try:
            old = json.loads(path.read_text())
        except (OSError, ValueError):
            old = {}
        if not isinstance(old, dict) or old.get("mode") != meta.get("mode"):
            old = {}
    benchmarks: dict[str, Any] = {}
    kept: list[str] = []
    for name, entry in (old.get("benchmarks") or {}).items():
        if name in fresh:
            benchmarks[name] = fresh[name]
        elif isinstance(entry, dict):
            entry.setdefault("run", {k: old.get(k) for k in RUN_KEYS})
            benchmarks[name] = entry
            kept.append(name)
    for name, entry in fresh.items():
        benchmarks.setdefault(name, entry)
    if GOALS in benchmarks:  # the goal rows come first
        benchmarks = {GOALS: benchmarks.pop(GOALS), **benchmarks}
    path.write_text(json.dumps({**meta, "benchmarks": benchmarks}, indent=2, default=str) + "\n")
    return kept
