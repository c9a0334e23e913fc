"""The closing summary of ``photojobs run`` (a table, or one JSON line) and its exit code."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from photojobs.api import Client, left_out_lines, skipped_text
from photojobs.cli_support import shown
from photojobs.progress import failure_lines, lane_row
from photojobs.runner.outcome import EXIT_FAILED_ITEMS, EXIT_OK
from photos.analyze import near_duplicate_groups
from store import jobs as store_jobs

#: How many left-out files the text summary names (``--json``'s ``left_out_files`` names all).
LEFT_OUT_SHOWN = 50


def summarize(
    client: Client,
    job_id: int,
    *,
    restarts: int,
    skipped: dict[str, int],
    state_dir: Path,
    left_out: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The job's outcome: lanes, failures by reason, destinations, recoveries, near-duplicates."""
    status = client.status(job_id)
    failures = [g.as_dict() for g in client.failures(job_id)]
    counts = store_jobs.event_type_counts(client.engine, job_id, ["lease_expired", "stale_commit_rejected"])
    destinations = {k: v for k, v in status.params.items() if k in ("archive.root", "upload.target") and v}
    groups: list[list[str]] = []
    if "analysis" in status.lane_order:
        facts = store_jobs.job_results(client.engine, job_id, "analysis")
        groups = near_duplicate_groups(
            [(f"photo {f['photo']}", f.get("phash")) for f in facts],
            int(status.params.get("analysis.dup_distance", 6)),
        )
    return {
        "job": job_id,
        "state": status.state,
        "lanes": {lane: lane_row(status.lanes.get(lane, {})) for lane in status.lane_order},
        "failures": failures,
        "destinations": destinations,
        "worker_restarts": restarts,
        "recoveries": counts["lease_expired"],
        "stale_commits_rejected": counts["stale_commit_rejected"],
        "near_duplicate_groups": len(groups),
        "skipped_files": skipped,
        "left_out_files": list(left_out or []),
        "state_dir": str(state_dir),
    }


def exit_code(summary: dict[str, Any]) -> int:
    return EXIT_OK if summary["state"] == "succeeded" else EXIT_FAILED_ITEMS


def print_summary(console: Console, summary: dict[str, Any]) -> None:
    table = Table(title=f"job {summary['job']}: {summary['state']}")
    for col in ("lane", "succeeded", "failed", "skipped", "cancelled", "paused"):
        table.add_column(col, justify="left" if col == "lane" else "right")
    for lane, row in summary["lanes"].items():
        cells = [str(row[k]) for k in ("succeeded", "failed", "skipped", "cancelled", "paused")]
        table.add_row(lane, *cells)
    console.print(table)
    where = f" --state-dir {shlex.quote(summary['state_dir'])}"
    for line in failure_lines(summary["job"], summary["failures"], where):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    for key, value in summary["destinations"].items():
        console.print(f"{key}: {shown(value)}", highlight=False, markup=False)
    if summary["skipped_files"]:  # nothing left out silently
        left_out = skipped_text(summary["skipped_files"])
        console.print(f"left out of the job: {left_out}", highlight=False)
        for line in left_out_lines(summary.get("left_out_files", []), LEFT_OUT_SHOWN):
            console.print(shown(line), highlight=False, soft_wrap=True, markup=False)
    console.print(
        f"worker restarts {summary['worker_restarts']}, lease recoveries {summary['recoveries']}, "
        f"stale commits rejected {summary['stale_commits_rejected']}, "
        f"near-duplicate groups {summary['near_duplicate_groups']}",
        highlight=False,
    )


def report(console: Console, summary: dict[str, Any], as_json: bool) -> int:
    """Print the summary (one JSON line on stdout with ``as_json``); returns the exit code."""
    if as_json:
        print(json.dumps(summary))
    else:
        print_summary(console, summary)
    return exit_code(summary)
