"""The randomized chaos run: jobs over a shared pool of photo files, a worker fleet, and a seeded
schedule of faults (SIGKILL, SIGSTOP/SIGCONT, SIGTERM, Redis FLUSHALL, sweeper deaths) and job
controls (cancel, pause, resume) while the jobs run.

The seed fixes every random decision of the schedule (what to do, to which job or worker, when);
the interleaving of the processes is not reproducible, so a seed replays the same kind of run.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from store.control import ControlBusy
from store.engine import make_engine
from store.errors import NotApplicable, UnknownJob
from store.events import EventRecord, read_events
from store.models import Event, Item, Job
from tests.chaos.checker import SETTLED_JOB_STATES, check_cursors
from tests.support import Fleet, RedisServer, poll, wait_for

WORKERS = 4
THREADS = 2
POOL = 36  # photo files shared by every job
OUTSTANDING = 48  # submit more jobs only while fewer items than this are still to run
RECENT = 8  # random controls pick among the most recent jobs (older ones are done)
ACTIVE_STATES = ("waiting", "pending", "queued", "running")

# Roles decide what the schedule does to a job (random actions come on top).
PLAIN, PAUSE_RESUME, CANCEL, LEAVE_PAUSED = "plain", "pause_resume", "cancel", "leave_paused"


def chaos_seed() -> int:
    raw = os.environ.get("PHOTOJOBS_CHAOS_SEED", "").strip()
    return int(raw) if raw else random.SystemRandom().randrange(1, 2**31)


def chaos_seconds(default: float) -> float:
    raw = os.environ.get("PHOTOJOBS_CHAOS_SECONDS", "").strip()
    return float(raw) if raw else default


#: A job control answered ControlBusy (a frozen holder's transaction) is tried again this many times,
#: BUSY_WAIT apart (the store ends such a transaction within the lease TTL, 2 s here).
BUSY_TRIES = 8
BUSY_WAIT = 1.0


@dataclass
class ChaosJob:
    id: int
    role: str
    sleep: float
    paths: list[str]
    cancelled: bool = False
    pauses: int = 0
    resumes: int = 0
    retries: int = 0
    pruned: bool = False  # gone from the store (a prune took it once it had finished)


@dataclass
class Worker:
    proc: subprocess.Popen[bytes]
    thaw: threading.Timer | None = None  # set while SIGSTOPped

    @property
    def frozen(self) -> bool:
        return self.thaw is not None


class EventTail(threading.Thread):
    """A live reader following the cursor during the run, as a consumer of the event log would.

    Every cursor it sees must be the next one, and what it saw at a cursor must be what the final
    read finds there (``compare``)."""

    def __init__(self, db_url: str, seed: int) -> None:
        super().__init__(name="chaos-event-tail", daemon=True)
        self.engine = make_engine(db_url)
        self.rng = random.Random(seed ^ 0x7A11)
        self.seen: list[EventRecord] = []
        self.violations: list[str] = []
        self.skipped: set[int] = set()  # cursors the reader never got (pruned before it read them?)
        self.errors = 0
        self._halt = threading.Event()

    def run(self) -> None:
        cursor = 0
        while not self._halt.wait(self.rng.uniform(0.05, 0.3)):
            try:
                # Half the reads number pending events themselves (racing the sweeper's numbering).
                got = read_events(self.engine, after=cursor, limit=300, sequence=self.rng.random() < 0.5)
            except Exception:  # noqa: BLE001 - a store blip (a frozen lock holder) is retried
                self.errors += 1
                continue
            expected = cursor + 1
            for e in got:
                self.skipped.update(range(expected, e.cursor))
                expected = max(expected, e.cursor + 1)
            steps = [v for v in check_cursors(got, after=cursor) if not v.startswith("cursor gap")]
            self.violations.extend(f"live reader: {v}" for v in steps)
            self.seen.extend(got)
            if got:
                cursor = got[-1].cursor

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=30)
        self.engine.dispose()

    def compare(
        self, final: list[EventRecord], pruned: set[int] | None = None, cutoff: float | None = None
    ) -> list[str]:
        """What the reader saw against the final read. A run that pruned passes the jobs it pruned
        and its latest prune's cutoff: an event the final read lacks may have been pruned (its job
        was, or it is older than the cutoff); a cursor the reader never got may have been pruned
        before it read that far, if the final read lacks it too."""
        out = list(self.violations)
        by_cursor = {e.cursor: e for e in final}
        for c in sorted(self.skipped):
            if c in by_cursor or pruned is None:
                out.append(f"live reader: cursor gap: it never got cursor {c} ({by_cursor.get(c)})")
        for e in self.seen:
            f = by_cursor.get(e.cursor)
            key = (e.type, e.item, e.token, e.worker, e.job)
            old = cutoff is not None and e.at < cutoff
            if f is None and pruned is not None and (e.job in pruned or old):
                continue  # pruned
            if f is None or (f.type, f.item, f.token, f.worker, f.job) != key:
                out.append(f"live reader saw {key} at cursor {e.cursor}, the final read has {f}")
        return out


@dataclass
class ChaosRun:
    seed: int
    seconds: float
    engine: Engine
    env: dict[str, str]
    fleet: Fleet
    redis: RedisServer
    workdir: Path
    say: Callable[[str], None] = print
    rng: random.Random = field(init=False)
    client: Client = field(init=False)
    jobs: list[ChaosJob] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    sweepers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    stopping: list[subprocess.Popen[bytes]] = field(default_factory=list)  # SIGTERMed workers
    schedule: list[tuple[float, str, int]] = field(default_factory=list)  # (due, action, job id)
    forced: list[tuple[float, str]] = field(default_factory=list)  # (due, fault) each fault once
    actions: Counter[str] = field(default_factory=Counter)
    log: list[str] = field(default_factory=list)
    pool: list[Path] = field(default_factory=list)
    tail: EventTail | None = None
    t0: float = 0.0
    prunes: int = 0  # prunes that ran (with or without a job to take)
    cutoff: float | None = None  # the latest prune's cutoff (database clock)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.client = Client(Settings.from_env(self.env), engine=self.engine)

    # -- bookkeeping --------------------------------------------------------------------------
    def note(self, what: str) -> None:
        line = f"{time.monotonic() - self.t0:7.2f}s {what}"
        self.log.append(line)
        self.say(line)

    def job(self, job_id: int) -> ChaosJob:
        return next(j for j in self.jobs if j.id == job_id)

    def active_items(self) -> int:
        """Items still to run (paused ones wait for a resume and do not load the fleet)."""
        with Session(self.engine) as s:
            return int(
                s.execute(
                    select(func.count()).select_from(Item).where(Item.state.in_(ACTIVE_STATES))
                ).scalar_one()
            )

    def recent(self, jobs: list[ChaosJob]) -> list[ChaosJob]:
        """The most recently submitted of ``jobs``: the ones likely to be still running."""
        return jobs[-RECENT:]

    def controls(self) -> dict[int, str | None]:
        with Session(self.engine) as s:
            return dict(s.execute(select(Job.id, Job.control)).all())

    # -- processes ----------------------------------------------------------------------------
    def start_worker(self) -> Worker:
        w = Worker(self.fleet.start_worker(["noop"], threads=THREADS))
        self.workers.append(w)
        return w

    def start_sweeper(self) -> None:
        self.sweepers.append(self.fleet.start_sweeper())

    @staticmethod
    def _signal(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    def _thaw(self, w: Worker) -> None:
        self._signal(w.proc, signal.SIGCONT)
        w.thaw = None

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        self._signal(proc, signal.SIGCONT)
        self._signal(proc, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    # -- jobs ---------------------------------------------------------------------------------
    def submit(self, role: str | None = None) -> ChaosJob:
        rng = self.rng
        if role is None:
            role = rng.choices([PLAIN, PAUSE_RESUME, CANCEL, LEAVE_PAUSED], [5, 3, 1.5, 0.7])[0]
        size = rng.randint(3, 18)
        paths = sorted(str(p) for p in rng.sample(self.pool, size))
        sleep = round(rng.uniform(0.1, 1.0), 2)
        job_id = self.client.submit(["noop"], paths, {"noop.sleep": str(sleep)}).job_id
        job = ChaosJob(job_id, role, sleep, paths)
        self.jobs.append(job)
        now = time.monotonic() - self.t0
        if role in (PAUSE_RESUME, LEAVE_PAUSED):
            at = now + rng.uniform(0.3, 6.0)
            self.schedule.append((at, "pause", job_id))
            if role == PAUSE_RESUME:
                self.schedule.append((at + rng.uniform(0.5, 5.0), "resume", job_id))
        elif role == CANCEL:
            self.schedule.append((now + rng.uniform(0.5, 8.0), "cancel", job_id))
        self.note(f"submit job {job_id} role={role} items={size} sleep={sleep}")
        return job

    def pruned_jobs(self) -> set[int]:
        return {j.id for j in self.jobs if j.pruned}

    def live_jobs(self) -> list[ChaosJob]:
        return [j for j in self.jobs if not j.pruned]

    def _gone(self, job: ChaosJob, what: str) -> None:
        """``what`` found no job: a prune took it (it had finished); the run checks it from the log."""
        job.pruned = True
        self.actions[f"{what}_of_pruned_job"] += 1
        self.note(f"{what} job {job.id}: pruned meanwhile")

    def retry(self, job: ChaosJob, why: str) -> None:
        """Retry the job (a cancelled one, whose cancelled items go back to work): it must then
        succeed. A job still stopping, or with nothing to retry, refuses; a pruned one is unknown."""
        try:
            n = self.client.retry(job.id)
        except UnknownJob:
            self._gone(job, "retry")
            return
        except NotApplicable as exc:
            self.actions["retry_refused"] += 1
            self.note(f"retry job {job.id} ({why}) refused: {exc}")
            return
        job.retries += 1
        job.cancelled = False
        job.role = PLAIN
        self.actions["retry"] += 1
        self.note(f"retry job {job.id} ({why}): {n} item(s) back to work")

    def prune(self, older_than: float) -> None:
        """Prune what finished more than ``older_than`` seconds ago while the fleet works on."""
        result = self.client.prune(older_than)
        self.prunes += 1
        self.cutoff = result.cutoff
        self.actions["prune"] += 1
        self.actions["pruned_jobs"] += result.jobs
        with Session(self.engine) as s:
            present = set(s.execute(select(Job.id)).scalars())
        for job in self.jobs:
            if not job.pruned and job.id not in present:
                job.pruned = True
        self.note(
            f"prune older than {older_than:.1f}s: {result.jobs} job(s), {result.items} item(s), "
            f"{result.events} event(s)"
        )

    def _patiently(self, what: str, job: ChaosJob, act: Callable[[], None]) -> None:
        """``act`` (a job control), tried again while the store answers ``ControlBusy``: a holder
        frozen inside a transaction keeps the job's rows locked until the store ends that
        transaction (within a lease TTL), and the control says "busy, nothing changed, try again"
        instead of hanging (issue 39) — as designed, not a finding, unless it stays busy longer
        than the store promises (``BUSY_TRIES`` x ``BUSY_WAIT``): then it raises."""
        for attempt in range(1, BUSY_TRIES + 1):
            try:
                act()
                return
            except ControlBusy:
                self.actions[f"{what}_busy"] += 1
                self.note(f"{what} job {job.id} busy (attempt {attempt}): tried again in {BUSY_WAIT:g} s")
                if attempt == BUSY_TRIES:
                    raise
                time.sleep(BUSY_WAIT)

    def pause(self, job: ChaosJob, why: str) -> None:
        try:
            self._patiently("pause", job, lambda: self._pause(job, why))
        except UnknownJob:
            self._gone(job, "pause")
        except NotApplicable as exc:
            self._refused(job, "pause", exc)

    def resume(self, job: ChaosJob, why: str) -> None:
        try:
            self._patiently("resume", job, lambda: self._resume(job, why))
        except UnknownJob:
            self._gone(job, "resume")
        except NotApplicable as exc:
            self._refused(job, "resume", exc)

    def cancel(self, job: ChaosJob, why: str) -> None:
        try:
            self._patiently("cancel", job, lambda: self._cancel(job, why))
        except UnknownJob:
            self._gone(job, "cancel")
            job.cancelled = True  # as wanted: the job had ended before it
        except NotApplicable as exc:
            self._refused(job, "cancel", exc)

    def _refused(self, job: ChaosJob, what: str, exc: NotApplicable) -> None:
        """``what`` did not apply to the job as it was by then (it finished meanwhile, or was being
        cancelled): the store refused it and changed nothing (``store.control.CONTROL_APPLIES``)."""
        self.actions[f"{what}_refused"] += 1
        self.note(f"{what} job {job.id} refused: {exc}")

    def _pause(self, job: ChaosJob, why: str) -> None:
        n = self.client.pause(job.id)
        job.pauses += 1
        self.actions["pause"] += 1
        self.note(f"pause job {job.id} ({why}): {n} item(s) paused now")

    def _resume(self, job: ChaosJob, why: str) -> None:
        n = self.client.resume(job.id)
        job.resumes += 1
        self.actions["resume"] += 1
        self.note(f"resume job {job.id} ({why}): {n} item(s) resumed")

    def _cancel(self, job: ChaosJob, why: str) -> None:
        n = self.client.cancel(job.id)
        job.cancelled = True
        self.actions["cancel"] += 1
        self.note(f"cancel job {job.id} ({why}): {n} item(s) cancelled now")

    # -- the faults ---------------------------------------------------------------------------
    def act_kill(self) -> None:
        w = self.workers[self.rng.randrange(len(self.workers))]
        if w.thaw is not None:
            w.thaw.cancel()
        self._kill(w.proc)
        self.workers.remove(w)
        self.start_worker()
        self.actions["sigkill"] += 1
        self.note(f"SIGKILL worker pid {w.proc.pid}{' (frozen)' if w.frozen else ''}; replacement started")

    def act_freeze(self) -> None:
        rng = self.rng
        long = rng.random() < 0.5
        seconds = rng.uniform(2.5, 6.0) if long else rng.uniform(0.2, 1.5)  # the lease TTL is 2 s
        live = [w for w in self.workers if not w.frozen]
        if len([w for w in self.workers if w.frozen]) >= 2 or not live:
            self.note("freeze skipped: two workers are frozen already")
            return
        w = live[rng.randrange(len(live))]
        self._signal(w.proc, signal.SIGSTOP)
        w.thaw = threading.Timer(seconds, self._thaw, args=(w,))
        w.thaw.daemon = True
        w.thaw.start()
        self.actions["sigstop_long" if long else "sigstop_short"] += 1
        self.note(f"SIGSTOP worker pid {w.proc.pid} for {seconds:.1f}s")

    def act_term(self) -> None:
        live = [w for w in self.workers if not w.frozen]
        if not live:
            return
        w = live[self.rng.randrange(len(live))]
        # To the dramatiq main process alone: it stops its worker gracefully (a SIGTERM to the whole
        # group would kill the worker child at once, which is what SIGKILL already covers).
        try:
            os.kill(w.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        self.workers.remove(w)
        self.stopping.append(w.proc)
        self.start_worker()
        self.actions["sigterm"] += 1
        self.note(f"SIGTERM worker pid {w.proc.pid} (graceful shutdown); replacement started")

    def act_flushall(self) -> None:
        self.redis.client().flushall()
        self.actions["flushall"] += 1
        self.note("Redis FLUSHALL")

    def act_sweeper(self) -> None:
        if len(self.sweepers) < 2:
            self.start_sweeper()
            self.note("second sweeper started")
        else:
            victim = self.sweepers.pop(self.rng.randrange(len(self.sweepers)))
            self._kill(victim)
            self.note(f"SIGKILL sweeper pid {victim.pid}")
        self.actions["sweeper"] += 1

    def act_pause(self) -> None:
        pool = self.recent([j for j in self.live_jobs() if not j.cancelled and j.role != LEAVE_PAUSED])
        if pool:
            self.pause(pool[self.rng.randrange(len(pool))], "random")

    def act_resume(self) -> None:
        pool = [
            j for j in self.live_jobs() if not j.cancelled and j.role != LEAVE_PAUSED and j.pauses > j.resumes
        ]
        if pool:
            self.resume(pool[self.rng.randrange(len(pool))], "random")

    def act_cancel(self) -> None:
        pool = self.recent(
            [j for j in self.live_jobs() if not j.cancelled and j.role in (PLAIN, PAUSE_RESUME)]
        )
        if pool and sum(j.cancelled for j in self.jobs) < len(self.jobs) / 3:
            self.cancel(pool[self.rng.randrange(len(pool))], "random")

    def act_retry(self) -> None:
        """Retry a cancelled job that has cancelled items; with none, cancel a running job (a newly
        submitted one if need be) and retry it at once, racing its workers' stops."""
        cancelled = [j for j in self.jobs if j.cancelled and not j.pruned]
        with Session(self.engine) as s:  # the ones with something to retry (not all done before it)
            ids = set(
                s.execute(
                    select(Item.job_id).where(
                        Item.job_id.in_([j.id for j in cancelled]), Item.state == "cancelled"
                    )
                ).scalars()
            )
        pool = self.recent([j for j in cancelled if j.id in ids])
        if not pool:
            running = self.recent(
                [j for j in self.live_jobs() if not j.cancelled and j.role in (PLAIN, PAUSE_RESUME)]
            )
            job = running[self.rng.randrange(len(running))] if running else self.submit(PLAIN)
            self.cancel(job, "to retry it")
            pool = [job]
        self.retry(pool[self.rng.randrange(len(pool))], "random")

    def act_prune(self) -> None:
        # Not younger than a few seconds: the live reader has read (and the history keeps) every
        # event a prune deletes for its age; a pruned job's own events may go at once.
        self.prune(round(self.rng.uniform(3.0, 10.0), 1))

    def act_submit(self) -> None:
        if self.active_items() < OUTSTANDING:
            self.submit()

    def act_nothing(self) -> None:
        pass

    ACTIONS: tuple[tuple[str, float], ...] = (
        ("kill", 1.2),
        ("freeze", 1.5),
        ("term", 0.6),
        ("flushall", 0.5),
        ("sweeper", 0.4),
        ("pause", 1.2),
        ("resume", 1.4),
        ("cancel", 0.4),
        ("retry", 0.6),
        ("prune", 0.6),
        ("submit", 1.6),
        ("nothing", 0.8),
    )

    def run_due(self) -> None:
        now = time.monotonic() - self.t0
        due = sorted(s for s in self.schedule if s[0] <= now)
        self.schedule = [s for s in self.schedule if s[0] > now]
        for _, action, job_id in due:
            job = self.job(job_id)
            if job.cancelled or job.pruned:
                continue
            getattr(self, action)(job, f"role {job.role}")

    # -- the run ------------------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.monotonic()
        folder = self.workdir / "pool"
        folder.mkdir(parents=True, exist_ok=True)
        self.pool = []
        for i in range(POOL):
            p = folder / f"IMG_{i:04d}.jpg"
            p.write_text(f"photo {i}")
            self.pool.append(p)
        self.tail = EventTail(self.env["PHOTOJOBS_DATABASE_URL"], self.seed)
        self.tail.start()
        # Each role at least once, then a random mix.
        for role in (PAUSE_RESUME, CANCEL, LEAVE_PAUSED, PLAIN):
            self.submit(role)
        for _ in range(self.rng.randint(2, 5)):
            self.submit()
        self.start_sweeper()
        for _ in range(WORKERS):
            self.start_worker()
        # Every kind of fault at least once, at a random moment of the run.
        for fault in ("kill", "freeze", "term", "flushall", "retry", "prune"):
            self.forced.append((self.rng.uniform(0.15, 0.85) * self.seconds, fault))
        self.note(f"started {WORKERS} workers x {THREADS} threads, 1 sweeper, {len(self.jobs)} jobs")
        # The faults start once the fleet works: an item claimed with others of a batch message.
        # A worker killed or a Redis flushed before that sends every item alone (a retry never rides
        # in a batch), and the run would not test batch claims at all; on a loaded machine the
        # workers may take seconds to start. The schedule's times count from here.
        wait_for(self.batch_claimed, 90, interval=0.1, what="an item claimed in a batch message")
        self.t0 = time.monotonic()
        self.note("an item was claimed in a batch message: the faults begin")

    def batch_claimed(self) -> bool:
        with Session(self.engine) as s:
            details = s.execute(select(Event.detail).where(Event.type == "item_claimed")).scalars()
            return any((d or {}).get("batch") for d in details)

    def chaos(self) -> None:
        names = [a for a, _ in self.ACTIONS]
        weights = [w for _, w in self.ACTIONS]
        end = self.t0 + self.seconds
        while time.monotonic() < end:
            time.sleep(self.rng.uniform(0.2, 1.2))
            now = time.monotonic() - self.t0
            for due, fault in [f for f in self.forced if f[0] <= now]:
                self.forced.remove((due, fault))
                getattr(self, "act_" + fault)()
            self.run_due()
            getattr(self, "act_" + self.rng.choices(names, weights)[0])()

    def calm_down(self) -> None:
        """End the faults: thaw, reap, make sure the fleet is whole, resume paused jobs."""
        for w in self.workers:
            if w.thaw is not None:
                w.thaw.cancel()
                self._thaw(w)
        for proc in self.stopping:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.note(f"worker pid {proc.pid} did not stop within 20 s of SIGTERM; SIGKILL")
                self._kill(proc)
        for w in list(self.workers):
            if w.proc.poll() is not None:
                self.note(f"worker pid {w.proc.pid} had exited with {w.proc.returncode}; replacing it")
                self.workers.remove(w)
                self.start_worker()
        self.sweepers = [p for p in self.sweepers if p.poll() is None]
        if not self.sweepers:
            self.start_sweeper()
        controls = self.controls()
        for job in self.live_jobs():
            control = controls.get(job.id)
            if job.role == LEAVE_PAUSED and not job.cancelled and control != "pause":
                self.pause(job, "left paused at the end")
            elif job.role != LEAVE_PAUSED and control == "pause":
                self.resume(job, "end of chaos")
        self.note(f"chaos over: {dict(self.actions)}")

    def settle(self, timeout: float) -> dict[int, str]:
        """Wait (polling, with a deadline) until every job is terminal or paused; the last states."""
        states: dict[int, str] = {}

        def settled() -> bool:
            nonlocal states
            states = {j.id: self.client.status(j.id).state for j in self.live_jobs()}
            return all(s in SETTLED_JOB_STATES for s in states.values())

        poll(settled, timeout, 0.25)
        self.note(f"job states: {states}")
        return states

    def finish(self) -> None:
        for w in self.workers:
            if w.thaw is not None:
                w.thaw.cancel()
                self._thaw(w)
        if self.tail is not None:
            self.tail.stop()

    def describe(self) -> dict[str, Any]:
        return {
            "jobs": [
                (j.id, j.role, len(j.paths), j.sleep, j.pauses, j.resumes, j.cancelled, j.retries, j.pruned)
                for j in self.jobs
            ],
            "actions": dict(self.actions),
        }
