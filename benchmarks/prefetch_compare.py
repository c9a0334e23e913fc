"""No-op items/s of ``photojobs worker`` as a user starts it, with two prefetch settings side by side.

    python -m benchmarks.prefetch_compare [--items 2000] [--rounds 2] [--prefetch 4,8] [--sleep S]

Each case: a fresh SQLite store, a private Redis, ``photojobs worker --lanes noop --processes 2
--threads 4`` (its own sweeper) with ``dramatiq_queue_prefetch`` set, a warm-up job of 100 items,
then a job of N items; items/s from the job's first ``item_queued`` to its last ``item_succeeded``
(store clock). Cases alternate (A B A B …) so drifting machine load falls on both. Also printed:
the machine's busy CPU during the window (of 2 cores = 200 %) and the load average.

Not part of ``make bench`` (not registered): a helper for comparing prefetch settings.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from benchmarks import cpu
from photojobs.api import Client
from photojobs.config import Settings
from store.engine import make_engine
from store.models import Event, Item
from store.schema import upgrade
from tests.support import RedisServer, make_files, wait_for

ROOT = Path(__file__).resolve().parent.parent
TERMINAL = ("succeeded", "failed", "cancelled", "skipped")


def _done(settings: Settings, job: int, n: int) -> bool:
    engine = make_engine(settings.database_url)
    try:
        with Session(engine) as s:
            finished = s.execute(
                select(func.count()).where(Item.job_id == job, Item.state.in_(TERMINAL))
            ).scalar_one()
        return finished == n
    finally:
        engine.dispose()


def _submit(settings: Settings, folder: Path, params: dict[str, str]) -> int:
    client = Client(settings)
    try:
        return client.submit(["noop"], [folder], params).job_id
    finally:
        client.engine.dispose()


def _tree_cpu(pid: int) -> float:
    """CPU seconds of a process and its live descendants (the supervisor, its workers, the sweeper)."""
    total = 0.0
    root = psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _republished(settings: Settings, job: int) -> int:
    engine = make_engine(settings.database_url)
    try:
        with Session(engine) as s:
            q = select(func.count()).where(Event.job_id == job, Event.type == "item_republished")
            return int(s.execute(q).scalar_one())
    finally:
        engine.dispose()


def _window(settings: Settings, job: int) -> tuple[float, float, int]:
    engine = make_engine(settings.database_url)
    try:
        with Session(engine) as s:
            first = s.execute(
                select(func.min(Event.at)).where(Event.job_id == job, Event.type == "item_queued")
            ).scalar_one()
            last, n = s.execute(
                select(func.max(Event.at), func.count()).where(
                    Event.job_id == job, Event.type == "item_succeeded"
                )
            ).one()
        return float(first), float(last), int(n)
    finally:
        engine.dispose()


def run_case(
    workdir: Path, redis: RedisServer, prefetch: int, n: int, threads: int, processes: int, sleep: float
) -> dict:
    redis.client().flushall()
    db = workdir / f"store-{prefetch}-{time.monotonic_ns()}.db"
    url = f"sqlite:///{db}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    env = {
        **os.environ,
        "PHOTOJOBS_DATABASE_URL": url,
        "PHOTOJOBS_REDIS_URL": redis.url,
        "PHOTOJOBS_FLEET_PROCESSES": str(processes),
        "dramatiq_queue_prefetch": str(prefetch),
    }
    settings = Settings.from_env(env)
    log = open(workdir / f"worker-{prefetch}.log", "ab")  # noqa: SIM115
    cmd = [sys.executable, "-m", "photojobs", "worker", "--lanes", "noop"]
    cmd += ["--processes", str(processes), "--threads", str(threads)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
    try:
        warm = make_files(workdir / f"warm-{db.stem}", 100)
        params = {"noop.sleep": str(sleep)} if sleep else {}
        job = _submit(settings, warm[0].parent, params)
        wait_for(lambda: _done(settings, job, 100), 120, 0.2, "the warm-up job")
        folder = make_files(workdir / f"photos-{db.stem}", n)[0].parent
        load0, busy0, t0 = os.getloadavg()[0], cpu.machine_busy(), time.monotonic()
        ours0 = _tree_cpu(proc.pid)
        job = _submit(settings, folder, params)
        wait_for(lambda: _done(settings, job, n), 600, 0.2, "the measured job")
        busy1, t1, load1 = cpu.machine_busy(), time.monotonic(), os.getloadavg()[0]
        ours1 = _tree_cpu(proc.pid)
        first, last, succeeded = _window(settings, job)
        return {
            "prefetch": prefetch,
            "items_per_s": succeeded / (last - first),
            "seconds": last - first,
            "succeeded": succeeded,
            "machine_busy_pct": 100 * (busy1 - busy0) / (t1 - t0),
            "fleet_cpu_ms_per_item": 1000 * (ours1 - ours0) / n,
            "republished": _republished(settings, job),
            "load": (load0, load1),
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prefetch", default="4,8", help="comma-separated dramatiq_queue_prefetch values")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--sleep", type=float, default=0.0, help="noop.sleep of every item (I/O-like work)")
    args = ap.parse_args()
    values = [int(v) for v in args.prefetch.split(",")]
    with tempfile.TemporaryDirectory(prefix="pj-prefetch-") as tmp:
        workdir = Path(tmp)
        redis = RedisServer(workdir / "redis")
        redis.start()
        try:
            for r in range(args.rounds):
                for p in values:
                    c = run_case(workdir, redis, p, args.items, args.threads, args.processes, args.sleep)
                    print(
                        f"round {r + 1} prefetch {p:>2}: {c['items_per_s']:6.1f} items/s "
                        f"({c['succeeded']} in {c['seconds']:.1f} s), machine busy "
                        f"{c['machine_busy_pct']:.0f}% of 200%, fleet CPU "
                        f"{c['fleet_cpu_ms_per_item']:.1f} ms/item, republished {c['republished']}, "
                        f"load {c['load'][0]:.1f} -> {c['load'][1]:.1f}",
                        flush=True,
                    )
        finally:
            redis.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
