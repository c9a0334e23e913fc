"""Priority: a one-photo analysis job's latency while a 3,000-photo analysis job saturates the fleet.

One run, one fleet as users start it (``photojobs worker --processes 2 --threads 2 --lanes
analysis``, the supervisor's in-process sweeper), one store at a time (every store of ``--stores``
in full runs, SQLite with ``--quick``):

1. idle (after one-photo warm-up jobs until every worker process has run one, at most
   ``WARM_UP_MAX``): a one-photo job on the idle fleet, ``SMALL_RUNS`` times: from just before
   ``Client.submit`` to its ``item_succeeded`` (database clock, same host);
2. the big job alone (``PJBENCH_PRIORITY_PHOTOS`` photos, 3,000; 200 with ``--quick``): photos/s
   from the submission's commit to its last ``item_succeeded``; run again alone after step 3, and
   the two averaged (A-B-A: the store grows by a big job each run, and a drift of the machine's
   load or of the store's size then weighs on both sides of the ratio alike);
3. the big job again; once it has run for a while (a tenth of its photos done: Redis and the
   workers' prefetch are full of its messages) one-photo jobs one after another, alternately
   submitted without a priority (one photo: interactive by the size rule) and ``priority="normal"``
   (behind the big job's backlog: no priority), ``SMALL_RUNS`` each (one that ends after the big
   job is not counted); then its photos/s.

Goals (issue 24): the small job's latency with priority <= the idle latency + 2 items' time (an
item's time: P x T / the big job's photos/s alone, the wall time one thread spends per photo), and
the big job's throughput with the small jobs >= 0.95 x alone. Photos: ``generate_samples``
640x480 (seed 2), made once per run.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .analysis import make_photos
from .harness import BenchContext, BenchmarkError, command_line, failed_row, now_ms, wait_for
from .reader import Reader
from .registry import Row, register

NAME = "priority"
SIZE = (640, 480)
SEED = 2
BIG_PHOTOS = 3000
QUICK_PHOTOS = 200
SMALL_RUNS = 3
PROCESSES = 2
THREADS = 2
GOAL_THROUGHPUT = 0.95
GOAL_ITEMS = 2
POLL = 0.02
WARM_UP_MAX = 8  # one-photo jobs at most until every worker process has run one


def _singles(ctx: BenchContext, photos: Path, n: int) -> list[Path]:
    """``n`` folders of one photo each (copies: each small job its own photo)."""
    out = []
    for k, src in enumerate(sorted(photos.iterdir())[:n]):
        dest = ctx.workdir / f"priority-one-{k}"
        dest.mkdir(exist_ok=True)
        shutil.copy2(src, dest / f"one-{k}{src.suffix}")
        out.append(dest)
    return out


class _Run:
    """The fleet of one store: submit jobs, wait for them, read their times."""

    def __init__(self, ctx: BenchContext, store: str, reader: Reader, client: Any, procs: list[Any]) -> None:
        self.ctx, self.store, self.reader, self.client, self.procs = ctx, store, reader, client, procs

    def _alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                raise BenchmarkError(f"{p.args} exited with {p.returncode}: {self.ctx.procs.tail(p)}")

    def done(self, job_id: int, n: int) -> bool:
        self._alive()
        states = self.reader.states(job_id)
        if states.get("failed"):
            raise BenchmarkError(f"job {job_id} has failed items: {states}")
        return states.get("succeeded", 0) >= n

    def succeeded(self, job_id: int) -> int:
        return int(self.reader.states(job_id).get("succeeded", 0))

    def last_success(self, job_id: int) -> float:
        at = self.reader.scalar(
            "SELECT max(at) FROM events WHERE job_id = ? AND type = 'item_succeeded'", (job_id,)
        )
        return float(at)

    def workers_warm(self) -> int:
        """How many worker processes have finished an item (the first analysis in a process loads
        its libraries: ~200 ms more)."""
        n = self.reader.scalar("SELECT count(DISTINCT worker) FROM events WHERE type = 'item_succeeded'", ())
        return int(n or 0)

    def small(self, folder: Path, priority: str | None) -> float:
        """Seconds from just before the submission to the item's success."""
        t0 = time.time()
        job = self.client.submit(["analysis"], [folder], priority=priority).job_id
        wait_for(lambda: self.done(job, 1), 600, interval=POLL, what=f"small job {job}")
        return self.last_success(job) - t0

    def big(self, folder: Path, n: int) -> tuple[int, float]:
        """Submit the big job: its id and the submission's commit time."""
        job = self.client.submit(["analysis"], [folder]).job_id
        return job, time.time()

    def rate(self, job: int, n: int, committed: float) -> float:
        wait_for(lambda: self.done(job, n), 60 + n, interval=0.25, what=f"big job {job}")
        return n / (self.last_success(job) - committed)


def _measure(ctx: BenchContext, store: str, big_folder: Path, n: int, singles: list[Path]) -> dict[str, Any]:
    from photojobs.api import Client
    from photojobs.config import Settings

    url = ctx.dbs.create(store, NAME)
    procs: list[Any] = []
    client = None
    try:
        ctx.redis.flush()
        env = ctx.photojobs_env(url)
        env["PHOTOJOBS_RUNTIME_DIR"] = str(ctx.workdir / f"runtime-{NAME}-{store}")
        cmd = ctx.product_command(PROCESSES, THREADS, "analysis")
        ctx.note(
            command=f"{store}: " + command_line(cmd, env, ["PHOTOJOBS_DATABASE_URL", "PHOTOJOBS_REDIS_URL"])
        )
        since = now_ms()
        supervisor = ctx.start_product(env, cmd)
        procs.append(supervisor)
        ctx.wait_workers_ready([supervisor], since, PROCESSES)
        client = Client(Settings.from_env(env), migrate=False)
        reader = Reader(url)
        run = _Run(ctx, store, reader, client, procs)
        queue = list(singles)
        for _ in range(WARM_UP_MAX):  # warm-up: imports, connections, in every worker process
            run.small(queue.pop(), None)
            if run.workers_warm() >= PROCESSES:
                break
        idle = [run.small(queue.pop(), None) for _ in range(SMALL_RUNS)]
        job, committed = run.big(big_folder, n)
        alone = run.rate(job, n, committed)
        job, committed = run.big(big_folder, n)
        wait_for(lambda: run.succeeded(job) >= n // 10, 60 + n, interval=0.1, what="the big job under way")
        without: list[float] = []
        with_: list[float] = []
        late = 0  # small jobs that ended after the big one (not counted: the fleet was idle again)
        for _ in range(SMALL_RUNS):
            for priority, samples in ((None, with_), ("normal", without)):
                latency = run.small(queue.pop(), priority)
                if run.succeeded(job) < n:
                    samples.append(latency)
                else:
                    late += 1
        left = n - run.succeeded(job)
        shared = run.rate(job, n, committed)
        job, committed = run.big(big_folder, n)  # alone again: A-B-A, so a drift of the run cancels
        alone_after = run.rate(job, n, committed)
        reader.close()
        return {
            "idle": idle,
            "without": without,
            "with": with_,
            "alone": (alone + alone_after) / 2,
            "alone_runs": [alone, alone_after],
            "shared": shared,
            "left_after_small": left,
            "late": late,
        }
    finally:
        ctx.end_run(procs, client, url)


def _rows(store: str, n: int, m: dict[str, Any]) -> list[Row]:
    case = f"photojobs {store}, {PROCESSES}x{THREADS}"
    idle = statistics.median(m["idle"])
    if not m["with"] or not m["without"]:
        raise BenchmarkError(f"the big job ended before the small jobs could be measured during it: {m}")
    without = statistics.median(m["without"])
    with_ = statistics.median(m["with"])
    item_s = PROCESSES * THREADS / m["alone"]
    goal_s = idle + GOAL_ITEMS * item_s
    ratio = m["shared"] / m["alone"]

    def ms(xs: list[float]) -> str:
        return ", ".join(f"{1000 * x:.0f}" for x in xs)

    return [
        Row(
            NAME,
            case,
            "1-photo latency, idle fleet",
            round(1000 * idle),
            "ms",
            note=f"runs {ms(m['idle'])} ms",
        ),
        Row(
            NAME,
            case,
            f"1-photo latency during a {n}-photo job, no priority",
            round(1000 * without),
            "ms",
            note=f"submitted priority=normal; runs {ms(m['without'])} ms",
        ),
        Row(
            NAME,
            case,
            f"1-photo latency during a {n}-photo job, priority",
            round(1000 * with_),
            "ms",
            goal=f"<= idle + {GOAL_ITEMS} items' time ({1000 * goal_s:.0f} ms)",
            verdict="met" if with_ <= goal_s else "missed",
            baseline=f"{1000 * idle:.0f} ms idle",
            ratio=round(with_ / idle, 2),
            note=f"interactive by size; runs {ms(m['with'])} ms; an item's time {1000 * item_s:.0f} ms "
            f"({PROCESSES}x{THREADS} threads / {m['alone']:.1f} photos/s)",
        ),
        Row(
            NAME,
            case,
            f"{n}-photo job throughput with the small jobs / alone",
            round(ratio, 3),
            "x",
            goal=f">= {GOAL_THROUGHPUT}x",
            verdict="met" if ratio >= GOAL_THROUGHPUT else "missed",
            baseline=f"{m['alone']:.1f} photos/s alone",
            ratio=round(ratio, 3),
            note=f"{m['shared']:.1f} photos/s with {2 * SMALL_RUNS} one-photo jobs; alone before and after: "
            f"{m['alone_runs'][0]:.1f}, {m['alone_runs'][1]:.1f} photos/s "
            f"({m['left_after_small']} photos left when the last one ended; {m['late']} ended after "
            "the big job and are not counted)",
        ),
    ]


@register(NAME, "1-photo job latency during a 3,000-photo job, without/with priority, vs idle")
def priority(ctx: BenchContext) -> list[Row]:
    cfg = ctx.config
    env_n = os.environ.get("PJBENCH_PRIORITY_PHOTOS")
    n = int(env_n) if env_n else (QUICK_PHOTOS if cfg.quick else BIG_PHOTOS)
    stores = cfg.heavy_stores
    ctx.note(
        settings={
            "big job": f"{n} x {SIZE[0]}x{SIZE[1]} JPEG (generate_samples seed={SEED})",
            "fleet": f"photojobs worker --processes {PROCESSES} --threads {THREADS} --lanes analysis",
            "small jobs": f"{SMALL_RUNS} idle, then {SMALL_RUNS} without and {SMALL_RUNS} with priority",
            "stores": ",".join(stores),
        }
    )
    photos = make_photos(ctx, n, "priority-photos", seed=SEED, size=SIZE)
    singles = _singles(ctx, photos, WARM_UP_MAX + 3 * SMALL_RUNS)
    rows: list[Row] = []
    for store in stores:
        try:
            m = _measure(ctx, store, photos, n, singles)
            print(f"[benchmarks] {NAME} {store}: {m}", file=sys.stderr, flush=True)
            rows += _rows(store, n, m)
        except BenchmarkError as exc:
            rows.append(failed_row(NAME, f"photojobs {store}", "latency", exc))
            continue
    return rows
