"""``photojobs run``: everything on one machine with nothing to set up.

Embedded Redis (unless ``PHOTOJOBS_REDIS_URL``), a SQLite store in the state folder (unless
``PHOTOJOBS_DATABASE_URL``), the sweeper, a supervisor of N worker processes that restarts a dead
one alone, live progress, Ctrl-C = pause (twice = stop now), and a rerun of the same command
resumes the same job. :class:`Runner` composes the parts in ``photojobs.runner``.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from photojobs.api import Client, Plan
from photojobs.runner import summary as run_summary
from photojobs.runner.local_services import LocalServices
from photojobs.runner.outcome import (
    EXIT_FAILED_ITEMS,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TEMPFAIL,
    EXIT_WORKERS_FAILED,
    FINAL,
)
from photojobs.runner.signals import STOP_SIGNALS, StopSignals
from photojobs.runner.state_folder import (
    LOCK_NAME,
    WORKERS_FILE,
    StateFolder,
    StateFolderBusy,
    lock_state_folder,
    make_private_dir,
    make_private_sqlite,
    state_dir_for,
    stop_leftover_workers,
)
from photojobs.runner.watch import watch
from photojobs.runner.worker_killer import WorkerKiller
from photojobs.runner.workers import WorkerFleet
from photojobs.supervisor import store_recorder
from store.errors import BacklogFull

__all__ = [
    "EXIT_FAILED_ITEMS",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TEMPFAIL",
    "EXIT_WORKERS_FAILED",
    "FINAL",
    "LOCK_NAME",
    "STOP_SIGNALS",
    "WORKERS_FILE",
    "RunOptions",
    "Runner",
    "StateFolderBusy",
    "lock_state_folder",
    "make_private_dir",
    "make_private_sqlite",
    "run",
    "state_dir_for",
    "stop_leftover_workers",
]


@dataclass
class RunOptions:
    paths: list[str]
    lanes: list[str]
    params: dict[str, Any] = field(default_factory=dict)
    workers: int = 2
    threads: int = 2
    state: Path | None = None
    as_json: bool = False
    kill_worker_at: float | None = None  # demo: SIGKILL one worker when this share of items is done
    wait: bool = False  # wait for another run holding the state folder instead of refusing


class Runner:
    """One ``photojobs run``: lock the state folder, start the local services, find or submit the
    job, then (unless it is already over) watch it with the workers running, and sum it up."""

    def __init__(self, opts: RunOptions, console: Console) -> None:
        self.opts = opts
        self.console = console
        self.state_dir = state_dir_for(opts.paths, opts.state)
        self.skipped: dict[str, int] = {}  # what the folder scan left out, by reason
        self.left_out: list[dict[str, str]] = []  # and each file it left out
        self.fleet: WorkerFleet | None = None

    def run(self) -> int:
        folder = StateFolder(self.state_dir, self.opts.wait, self.console)
        with folder, LocalServices(self.state_dir, self.opts.workers, self.console) as local:
            client = Client(local.settings)
            plan = client.plan(self.opts.lanes, self.opts.paths, self.opts.params)
            self.skipped = dict(plan.skipped)
            self.left_out = list(plan.left_out)
            job_id = self._job(client, plan)
            if job_id is None:
                return EXIT_TEMPFAIL
            status = client.status(job_id)
            if status.state in FINAL:
                self.console.print(
                    f"job {job_id} already finished ({status.state}); nothing to do", highlight=False
                )
                return self._summary(client, job_id)
            return self._work(client, job_id, local, folder)

    def _work(self, client: Client, job_id: int, local: LocalServices, folder: StateFolder) -> int:
        # Ctrl-C, a polite kill and a closed terminal all pause the job cooperatively; the same
        # signal twice stops at once.
        with StopSignals() as stops:
            local.start_sweeper()
            self.fleet = WorkerFleet(
                self.opts.lanes,
                self.opts.workers,
                self.opts.threads,
                env=local.env,
                log_dir=folder.logs,
                record=folder.workers_file,
                recorder=store_recorder(client.engine),
            )
            self.fleet.start()
            try:
                killer = (
                    WorkerKiller(self.opts.kill_worker_at) if self.opts.kill_worker_at is not None else None
                )
                outcome = watch(self.console, client, job_id, stops, self.fleet, folder.logs, killer)
            finally:
                self.fleet.stop(timeout=1 if stops.stop_now else 15)
        code = self._summary(client, job_id)
        if outcome.gave_up:
            self.console.print(
                f"stopped: the workers kept crashing (see {folder.logs}); "
                "fix the cause and run the same command again to resume",
                highlight=False,
            )
            return EXIT_WORKERS_FAILED
        if outcome.interrupted:
            self.console.print(
                f"paused job {job_id}; run the same command again to resume it", highlight=False
            )
            return EXIT_INTERRUPTED
        return code

    def _job(self, client: Client, plan: Plan) -> int | None:
        """The job of ``plan``: the same job again (resumed if paused), else a new submission;
        None when the backlog is full."""
        existing = client.find_same_job(plan)
        if existing is not None:
            status = client.status(existing)
            if status.state in ("paused", "pausing"):
                client.resume(existing)
                self.console.print(f"resuming job {existing} (same paths, lanes and params)", highlight=False)
            elif status.state not in FINAL:
                self.console.print(
                    f"continuing job {existing} (same paths, lanes and params)", highlight=False
                )
            return existing
        try:
            submitted = client.submit(plan.lanes, [], plan=plan)
        except BacklogFull as exc:
            self.console.print(f"photojobs: {exc}", highlight=False)
            return None
        self.console.print(
            f"job {submitted.job_id}: {submitted.photos} photo(s) x {len(plan.lanes)} lane(s) "
            f"({','.join(plan.lanes)}), state in {self.state_dir}",
            highlight=False,
        )
        return submitted.job_id

    def _summary(self, client: Client, job_id: int) -> int:
        restarts = self.fleet.restarts if self.fleet is not None else 0
        summary = run_summary.summarize(
            client, job_id, restarts=restarts, skipped=self.skipped, state_dir=self.state_dir,
            left_out=self.left_out,
        )  # fmt: skip
        return run_summary.report(self.console, summary, self.opts.as_json)


def run(opts: RunOptions) -> int:
    console = Console(stderr=opts.as_json, soft_wrap=True)
    return Runner(opts, console).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(RunOptions(paths=sys.argv[1:], lanes=["noop"])))
