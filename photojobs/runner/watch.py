"""Live progress of ``photojobs run`` until the job ends, Ctrl-C pauses it, or every worker is given up."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from photojobs.api import Client
from photojobs.progress import Progress
from photojobs.runner.outcome import FINAL
from photojobs.runner.signals import StopSignals
from photojobs.runner.worker_killer import WorkerKiller
from photojobs.runner.workers import WorkerFleet
from store import jobs as store_jobs
from store.errors import NotApplicable

POLL = 0.25  # seconds between two looks at the job


@dataclass
class WatchResult:
    interrupted: bool = False  # Ctrl-C paused the job (or a second one stopped the run)
    gave_up: bool = False  # every worker crashed repeatedly and was given up


def watch(
    console: Console,
    client: Client,
    job_id: int,
    stops: StopSignals,
    fleet: WorkerFleet,
    log_dir: Path,
    killer: WorkerKiller | None = None,
) -> WatchResult:
    """Show progress until the job ends; pause it at the first stop signal (return at once on the
    second); give up when the fleet has given up every worker."""
    paused_by_us = False
    with Progress(console) as progress:
        while True:
            status = client.status(job_id)
            counts = store_jobs.event_type_counts(client.engine, job_id, ["lease_expired"])
            for text in fleet.new_events():
                progress.note(text)
            progress.update(status, restarts=fleet.restarts, recoveries=counts["lease_expired"])
            if stops.stop_now:
                progress.note("second Ctrl-C: stopping now; leases will expire and recover on the next run")
                return WatchResult(interrupted=True)
            if stops.pause_asked and not paused_by_us:
                try:
                    client.pause(job_id)
                except NotApplicable:
                    pass  # it finished (or was being stopped) meanwhile: nothing to pause
                paused_by_us = True
                progress.note(
                    "Ctrl-C: pausing; running items stop at their next safe point (again: stop now)"
                )
            if fleet.all_given_up:
                progress.note(f"every worker crashed repeatedly and was given up; logs: {log_dir}")
                return WatchResult(gave_up=True)
            if status.state in FINAL or (paused_by_us and status.state == "paused"):
                return WatchResult(interrupted=paused_by_us and status.state == "paused")
            if killer is not None:
                killer.maybe_kill(client, job_id, status, progress)
            time.sleep(POLL)
