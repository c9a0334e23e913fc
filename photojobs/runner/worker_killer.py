"""The demo's worker killer: SIGKILL one worker holding an item once a share of the job is done."""

from __future__ import annotations

import os
import signal

from photojobs.api import Client
from photojobs.progress import Progress
from store import items as store_items
from store import jobs as store_jobs


class WorkerKiller:
    """Kills at most one worker: the first ``maybe_kill`` that sees ``at`` (0..1) of the job's items
    done SIGKILLs a process holding a running item's lease (``make demo`` shows the recovery)."""

    def __init__(self, at: float) -> None:
        self.at = at
        self.killed = False

    def maybe_kill(
        self, client: Client, job_id: int, status: store_jobs.JobStatus, progress: Progress
    ) -> bool:
        """Whether a worker has been killed (by this call or an earlier one)."""
        if not self.killed:
            self.killed = self._kill_one(client, job_id, status, progress)
        return self.killed

    def _kill_one(
        self, client: Client, job_id: int, status: store_jobs.JobStatus, progress: Progress
    ) -> bool:
        totals = status.totals()
        total = sum(totals.values())
        done = sum(totals.get(s, 0) for s in ("succeeded", "failed", "skipped", "cancelled"))
        if not total or done / total < self.at:
            return False
        for item in store_items.running_items(client.engine, job_id):
            if item["lease_owner"]:
                pid = int(item["lease_owner"].split(":")[1])
                try:
                    # The worker as the supervisor knows it: the process group it started (the
                    # Dramatiq parent and the child holding the lease), so both name one pid.
                    group = os.getpgid(pid)
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                progress.note(
                    f"demo: SIGKILLed worker process {group} (its process {pid} held item {item['id']}, "
                    f"{item['lane']})"
                )
                return True
        return False
