"""``photojobs run``: everything on one machine with nothing to set up.

Embedded Redis (unless ``PHOTOJOBS_REDIS_URL``), a SQLite store in the state folder (unless
``PHOTOJOBS_DATABASE_URL``), the sweeper, a supervisor of N worker processes that restarts a dead
one alone, live progress, Ctrl-C = pause (twice = stop now), and a rerun of the same command
resumes the same job.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from photojobs.api import Client, Plan, photo_roots, skipped_text
from photojobs.cli_support import worker_command, worker_env
from photojobs.config import Settings
from photojobs.embedded_redis import EmbeddedRedis
from photojobs.lifeline import start_time, stop_orphans
from photojobs.progress import Progress, failure_lines, lane_row
from photojobs.supervisor import Supervisor, SupervisorEvent
from photojobs.sweeper_service import Sweeper
from photos.analyze import near_duplicate_groups
from store import items as store_items
from store import jobs as store_jobs
from store.errors import BacklogFull

EXIT_OK = 0
EXIT_FAILED_ITEMS = 1
EXIT_INTERRUPTED = 130
EXIT_TEMPFAIL = 75
EXIT_WORKERS_FAILED = 3
FINAL = {"succeeded", "failed", "partial", "cancelled"}
WORKERS_FILE = "workers.json"
LOCK_NAME = "run.lock"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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


def state_dir_for(paths: list[str], state: Path | None) -> Path:
    """``--state``, else ``.photojobs/`` next to the first photo root."""
    if state is not None:
        return state.expanduser().resolve()
    roots = photo_roots(paths)  # the roots only: the photos are walked once, by the plan
    base = roots[0] if roots else Path.cwd()
    return base.parent / ".photojobs"


class StateFolderBusy(Exception):
    """Another live ``photojobs run`` holds the state folder's lock."""

    def __init__(self, state_dir: Path, holder: str) -> None:
        self.state_dir = state_dir
        self.holder = holder
        super().__init__(
            f"state folder {state_dir} is in use by {holder}; wait for it to finish, "
            "or pass --wait to start when it does"
        )


def _lock_holder(path: Path) -> str:
    try:
        pid = int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return "another photojobs run"
    return f"photojobs run pid {pid}"


def lock_state_folder(state_dir: Path, wait: bool = False, console: Console | None = None) -> int:
    """Take the state folder's lock (``run.lock``, an ``flock`` held for the run's lifetime) and
    return its descriptor; it is released when the process ends, however it ends.  Raises
    :class:`StateFolderBusy` naming the holder, or with ``wait`` blocks until the holder is done."""
    path = state_dir / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(path)
            if not wait:
                raise StateFolderBusy(state_dir, holder) from None
            if console is not None:
                console.print(f"waiting for {holder} to finish with {state_dir}", highlight=False)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {start_time(os.getpid())}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents) with the folder itself 0700; tighten it if it exists."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077 and path.stat().st_uid == os.getuid():
        path.chmod(0o700)


def make_private_sqlite(url: str, state_dir: Path) -> None:
    """A SQLite store in the state folder is created 0600 before SQLite opens it (its -wal and -shm
    files take the database file's mode); an older, looser one is tightened."""
    prefix = "sqlite:///"
    if not url.startswith(prefix):
        return
    db = Path(url[len(prefix):])
    if db.parent != state_dir:
        return
    os.close(os.open(db, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    for path in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        with contextlib.suppress(FileNotFoundError):
            if path.stat().st_mode & 0o077:
                path.chmod(0o600)


def stop_leftover_workers(state_dir: Path, console: Console) -> int:
    """Stop the workers a killed ``photojobs run`` on this state folder left behind, found by the
    identity recorded in ``workers.json`` (owner pid and start time, fleet token), never by name;
    the workers of a live owner are never touched."""
    killed = stop_orphans([state_dir / WORKERS_FILE])
    if killed:
        console.print(
            f"stopped {killed} worker process(es) left over from an earlier run that was killed",
            highlight=False,
        )
    return killed


class Runner:
    def __init__(self, opts: RunOptions, console: Console) -> None:
        self.opts = opts
        self.console = console
        self.interrupts = 0
        self.restarts = 0
        self.events: list[str] = []
        self.lock = threading.Lock()
        self.supervisor: Supervisor | None = None
        self.gave_up = False
        self.skipped: dict[str, int] = {}  # what the folder scan left out, by reason
        self.state_dir = state_dir_for(opts.paths, opts.state)

    # -- signals and supervisor events ---------------------------------------------------
    def _on_sigint(self, *_: object) -> None:
        self.interrupts += 1

    def _on_worker_event(self, event: SupervisorEvent) -> None:
        with self.lock:
            if event.kind == "restarted":
                self.restarts += 1
            if event.kind in ("exited", "restarted", "gave_up", "spawn_failed"):
                what = f"worker {event.index}: {event.kind}"
                if event.signal or event.returncode is not None:
                    what += f" ({event.signal or f'exit {event.returncode}'})"
                if event.kind == "gave_up":
                    what += f" - {event.message}"
                self.events.append(what)

    # -- the run --------------------------------------------------------------------------
    def run(self) -> int:
        make_private_dir(self.state_dir)
        lock = lock_state_folder(self.state_dir, self.opts.wait, self.console)
        try:
            return self._run_locked()
        finally:
            os.close(lock)

    def _run_locked(self) -> int:
        env = dict(os.environ)
        env.setdefault("PHOTOJOBS_DATABASE_URL", f"sqlite:///{self.state_dir / 'photojobs.db'}")
        stop_leftover_workers(self.state_dir, self.console)
        make_private_sqlite(env["PHOTOJOBS_DATABASE_URL"], self.state_dir)
        embedded: EmbeddedRedis | None = None
        if not env.get("PHOTOJOBS_REDIS_URL"):
            embedded = EmbeddedRedis(self.state_dir)
            env["PHOTOJOBS_REDIS_URL"] = embedded.start()
            if embedded.adopted:
                self.console.print("reusing the embedded Redis left by an earlier run", highlight=False)
        env.setdefault("PHOTOJOBS_FLEET_PROCESSES", str(self.opts.workers))
        settings = Settings.from_env(env)
        sweeper: Sweeper | None = None
        try:
            client = Client(settings)
            plan = client.plan(self.opts.lanes, self.opts.paths, self.opts.params)
            self.skipped = dict(plan.skipped)
            job_id = self._job(client, plan)
            if job_id is None:
                return EXIT_TEMPFAIL
            status = client.status(job_id)
            if status.state in FINAL:
                self.console.print(
                    f"job {job_id} already finished ({status.state}); nothing to do", highlight=False
                )
                return self._summary(client, job_id)
            # Ctrl-C, a polite kill and a closed terminal all pause the job cooperatively; the same
            # signal twice stops at once.
            previous = {sig: signal.signal(sig, self._on_sigint) for sig in STOP_SIGNALS}
            sweeper = Sweeper(settings)
            sweeper.start()
            self.supervisor = Supervisor(
                lambda i: worker_command(self.opts.lanes, self.opts.threads),
                self.opts.workers,
                env=worker_env(self.opts.threads, env, processes=self.opts.workers),
                on_event=self._on_worker_event,
                log_dir=self.state_dir / "logs",
                record=self.state_dir / WORKERS_FILE,
            )
            self.supervisor.start()
            try:
                interrupted = self._watch(client, job_id)
            finally:
                self.supervisor.stop(timeout=1 if self.interrupts >= 2 else 15)
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
            code = self._summary(client, job_id)
            if self.gave_up:
                self.console.print(
                    f"stopped: the workers kept crashing (see {self.state_dir / 'logs'}); "
                    "fix the cause and run the same command again to resume",
                    highlight=False,
                )
                return EXIT_WORKERS_FAILED
            if interrupted:
                self.console.print(
                    f"paused job {job_id}; run the same command again to resume it", highlight=False
                )
                return EXIT_INTERRUPTED
            return code
        finally:
            if sweeper is not None:
                sweeper.stop()
            if embedded is not None:
                embedded.stop()

    def _job(self, client: Client, plan: Plan) -> int | None:
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

    def _watch(self, client: Client, job_id: int) -> bool:
        """Show progress until the job ends; returns True when Ctrl-C paused it."""
        paused_by_us = False
        killed = False
        seen_events = 0
        with Progress(self.console) as progress:
            while True:
                status = client.status(job_id)
                counts = store_jobs.event_type_counts(client.engine, job_id, ["lease_expired"])
                with self.lock:
                    new_events, seen_events = self.events[seen_events:], len(self.events)
                for text in new_events:
                    progress.note(text)
                progress.update(status, restarts=self.restarts, recoveries=counts["lease_expired"])
                if self.interrupts >= 2:
                    progress.note(
                        "second Ctrl-C: stopping now; leases will expire and recover on the next run"
                    )
                    return True
                if self.interrupts == 1 and not paused_by_us:
                    client.pause(job_id)
                    paused_by_us = True
                    progress.note(
                        "Ctrl-C: pausing; running items stop at their next safe point (again: stop now)"
                    )
                if self.supervisor is not None and len(self.supervisor.gave_up_slots) == self.opts.workers:
                    progress.note(
                        f"every worker crashed repeatedly and was given up; logs: {self.state_dir / 'logs'}"
                    )
                    self.gave_up = True
                    return False
                if status.state in FINAL or (paused_by_us and status.state == "paused"):
                    return paused_by_us and status.state == "paused"
                if self.opts.kill_worker_at is not None and not killed:
                    killed = self._maybe_kill_worker(client, job_id, status, progress)
                time.sleep(0.25)

    def _maybe_kill_worker(
        self, client: Client, job_id: int, status: store_jobs.JobStatus, progress: Progress
    ) -> bool:
        totals = status.totals()
        total = sum(totals.values())
        done = sum(totals.get(s, 0) for s in ("succeeded", "failed", "skipped", "cancelled"))
        if not total or done / total < (self.opts.kill_worker_at or 0):
            return False
        for item in store_items.running_items(client.engine, job_id):
            if item["lease_owner"]:
                pid = int(item["lease_owner"].split(":")[1])
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                progress.note(
                    f"demo: SIGKILLed worker process {pid} holding item {item['id']} ({item['lane']})"
                )
                return True
        return False

    # -- the end --------------------------------------------------------------------------
    def _summary(self, client: Client, job_id: int) -> int:
        status = client.status(job_id)
        failures = [g.as_dict() for g in client.failures(job_id)]
        counts = store_jobs.event_type_counts(
            client.engine, job_id, ["lease_expired", "stale_commit_rejected"]
        )
        destinations = {
            k: v for k, v in status.params.items() if k in ("archive.root", "upload.target") and v
        }
        groups: list[list[str]] = []
        if "analysis" in status.lane_order:
            facts = store_jobs.job_results(client.engine, job_id, "analysis")
            groups = near_duplicate_groups(
                [(f"photo {f['photo']}", f.get("phash")) for f in facts],
                int(status.params.get("analysis.dup_distance", 6)),
            )
        summary = {
            "job": job_id,
            "state": status.state,
            "lanes": {lane: lane_row(status.lanes.get(lane, {})) for lane in status.lane_order},
            "failures": failures,
            "destinations": destinations,
            "worker_restarts": self.restarts,
            "recoveries": counts["lease_expired"],
            "stale_commits_rejected": counts["stale_commit_rejected"],
            "near_duplicate_groups": len(groups),
            "skipped_files": self.skipped,
            "state_dir": str(self.state_dir),
        }
        if self.opts.as_json:
            print(json.dumps(summary))
        else:
            self._print_summary(summary)
        return EXIT_OK if status.state == "succeeded" else EXIT_FAILED_ITEMS

    def _print_summary(self, summary: dict[str, Any]) -> None:
        table = Table(title=f"job {summary['job']}: {summary['state']}")
        for col in ("lane", "succeeded", "failed", "skipped", "cancelled", "paused"):
            table.add_column(col, justify="left" if col == "lane" else "right")
        for lane, row in summary["lanes"].items():
            cells = [str(row[k]) for k in ("succeeded", "failed", "skipped", "cancelled", "paused")]
            table.add_row(lane, *cells)
        self.console.print(table)
        where = f" --state-dir {shlex.quote(summary['state_dir'])}"
        for line in failure_lines(summary["job"], summary["failures"], where):
            self.console.print(line, highlight=False, soft_wrap=True, markup=False)
        for key, value in summary["destinations"].items():
            self.console.print(f"{key}: {value}", highlight=False)
        if summary["skipped_files"]:  # nothing left out silently
            left_out = skipped_text(summary["skipped_files"])
            self.console.print(f"left out of the job: {left_out}", highlight=False)
        self.console.print(
            f"worker restarts {summary['worker_restarts']}, lease recoveries {summary['recoveries']}, "
            f"stale commits rejected {summary['stale_commits_rejected']}, "
            f"near-duplicate groups {summary['near_duplicate_groups']}",
            highlight=False,
        )


def run(opts: RunOptions) -> int:
    console = Console(stderr=opts.as_json, soft_wrap=True)
    return Runner(opts, console).run()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run(RunOptions(paths=sys.argv[1:], lanes=["noop"])))
