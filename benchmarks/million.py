"""A million photos across hosts (issue 32): one big no-op job on PostgreSQL, two ``photojobs worker``
supervisors as two hosts would run them, one SIGKILLed at half-way and restarted.

- **the job**: ``PJBENCH_MILLION_ITEMS`` empty files (default 1,000,000; ``--quick`` 20,000) in
  folders of 1,000, submitted with ``photojobs submit --lanes noop --param noop.sleep=0`` (a child
  process, timed with its CPU) while the fleet is running and idle;
- **the fleet**: two ``photojobs worker --processes 1 --threads 4`` (every lane, as users start it),
  each with its own ``PHOTOJOBS_RUNTIME_DIR`` and ``PHOTOJOBS_FLEET_PROCESSES=2`` (the whole fleet's
  size: each host's lane bound and top-up share fit two hosts); a warm-up job first;
- **the kill**: when the job's middle item has succeeded (items are dispatched in id order) host B's
  supervisor and its worker are SIGKILLed (every process group) and B is started again at once;
  its leases expire and host A's sweeper gives them out again;
- **the baseline**: plain Dramatiq 2 x 4 (``benchmarks.plain_actors``) on the same Redis, run just
  before and just after the job (A-B-A), ``PJBENCH_MILLION_PLAIN`` messages each (default 50,000;
  ``--quick`` 10,000);
- **figures**: submission time (and its CPU, and the backends' meanwhile); from the submission's
  commit to the last success: the steady rate (10-90 % of the job's successes by the database
  clock) against plain's, the rate of each tenth of the job, CPU seconds per 1,000 items (the
  supervisors' process trees, the PostgreSQL backends of the database — autovacuum workers
  included — and Redis, sampled from ``/proc`` every poll so processes that die still count); the
  sweeper's pass time per duty at half-way and at the end (timed in this process, a third
  sweeper), the store's size and dead rows at the end, and exactly-once from the event log (one
  ``item_succeeded`` per item, none twice).

Wall rates move with the machine's load; CPU per 1,000 items does not (much): compare those.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from . import cpu
from .harness import BenchContext, BenchmarkError, command_line, failed_row, now_ms, wait_for
from .reader import Reader
from .registry import Row, register
from .throughput import run_plain

NAME = "million"
DEFAULT_ITEMS, QUICK_ITEMS = 1_000_000, 20_000
DEFAULT_PLAIN, QUICK_PLAIN = 50_000, 10_000
PER_FOLDER = 1000
THREADS = 4
POLL_S = 1.0
GOAL_STEADY = 1.0  # steady rate >= 1.0x plain Dramatiq with two hosts
GOAL_LAST_TENTH = 0.8  # the last tenth >= 0.8x the first
GOAL_SUBMIT_S = 180.0  # submission of 1M <= 3 min
UNFINISHED = ("waiting", "pending", "queued", "running", "paused")


def sizes(ctx: BenchContext) -> tuple[int, int]:
    """(items of the job, messages of each plain run)."""
    quick = ctx.config.quick
    items = int(os.environ.get("PJBENCH_MILLION_ITEMS") or (QUICK_ITEMS if quick else DEFAULT_ITEMS))
    plain = int(os.environ.get("PJBENCH_MILLION_PLAIN") or (QUICK_PLAIN if quick else DEFAULT_PLAIN))
    return items, min(plain, items)


def make_tree(root: Path, n: int) -> Path:
    """``n`` empty ``.jpg`` files under ``root`` in sub-folders of ``PER_FOLDER``."""
    root.mkdir(parents=True, exist_ok=True)
    for start in range(0, n, PER_FOLDER):
        sub = root / f"d{start // PER_FOLDER:05d}"
        sub.mkdir(exist_ok=True)
        for i in range(start, min(n, start + PER_FOLDER)):
            (sub / f"p{i:07d}.jpg").touch()
    return root


class CpuTracker:
    """CPU seconds of changing sets of processes over a window: every ``sample`` reads the current
    members of each label (``finders``) from ``/proc`` and keeps each pid's latest total, so a process
    that dies in the window keeps what it used until its last sample (at most one poll lost)."""

    def __init__(self, finders: dict[str, Callable[[], Iterable[int]]]) -> None:
        self.finders = finders
        self.base: dict[int, float] = {}
        self.last: dict[str, dict[int, float]] = {label: {} for label in finders}
        self.started = False

    def _read(self) -> dict[int, float]:
        return {pid: total for pid, _comm, _pgrp, total in cpu._stats()}

    def start(self) -> None:
        """The window starts: what every current member used so far is not counted."""
        now = self._read()
        for label, find in self.finders.items():
            for pid in find():
                if pid in now:
                    self.base[pid] = now[pid]
                    self.last[label][pid] = now[pid]
        self.started = True

    def sample(self) -> None:
        """Read every current member (a new one counts from 0: it started in the window)."""
        now = self._read()
        for label, find in self.finders.items():
            for pid in find():
                if pid in now:
                    self.last[label][pid] = now[pid]

    def totals(self) -> dict[str, float]:
        """CPU seconds per label in the window."""
        return {
            label: round(sum(v - self.base.get(pid, 0.0) for pid, v in seen.items()), 3)
            for label, seen in self.last.items()
        }


def _backends(reader: Reader) -> Callable[[], list[int]]:
    def find() -> list[int]:
        return [
            r[0] for r in reader.rows("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ]

    return find


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _tenths(done: list[float]) -> list[float]:
    """Items/s of each tenth of the successes (sorted database times)."""
    n = len(done)
    out = []
    for k in range(10):
        lo, hi = (n * k) // 10, (n * (k + 1)) // 10 - 1
        span = done[hi] - done[lo]
        out.append(round((hi - lo) / span, 1) if span > 0 else float("nan"))
    return out


def _pass_times(engine: Any, specs: Any, publisher: Any, passes: int = 3) -> dict[str, float]:
    """Median ms per duty of ``passes`` sweep passes run here (a third sweeper beside the hosts')."""
    from photojobs.maintenance import default_services

    services = default_services(engine, specs, publisher, republish_after=5.0)
    times: dict[str, list[float]] = {}
    for _ in range(passes):
        total = 0.0
        for svc in services:
            t0 = time.perf_counter()
            svc.run_once()
            ms = 1000 * (time.perf_counter() - t0)
            total += ms
            times.setdefault(svc.name, []).append(ms)
        times.setdefault("pass", []).append(total)
    return {k: round(statistics.median(v), 1) for k, v in times.items()}


def _store_size(reader: Reader) -> dict[str, Any]:
    mib = 1024 * 1024
    out: dict[str, Any] = {
        "database_mib": round(reader.scalar("SELECT pg_database_size(current_database())") / mib, 1)
    }
    for table in ("items", "events", "photos", "jobs"):
        out[f"{table}_mib"] = round(reader.scalar(f"SELECT pg_total_relation_size('{table}')") / mib, 1)
    stats = reader.rows(
        "SELECT relname, n_live_tup, n_dead_tup, autovacuum_count, autoanalyze_count, vacuum_count "
        "FROM pg_stat_user_tables WHERE relname IN ('items', 'events', 'photos')"
    )
    out["tables"] = {
        r[0]: {"live": r[1], "dead": r[2], "autovacuums": r[3], "autoanalyzes": r[4], "vacuums": r[5]}
        for r in stats
    }
    return out


def _exactly_once(reader: Reader, job_id: int, n: int) -> dict[str, Any]:
    succeeded, distinct = reader.rows(
        "SELECT count(*), count(DISTINCT item_id) FROM events WHERE job_id = ? AND type = 'item_succeeded'",
        (job_id,),
    )[0]
    claims = reader.scalar(
        "SELECT count(*) FROM events WHERE job_id = ? AND type = 'item_claimed'", (job_id,)
    )
    expired = reader.scalar(
        "SELECT count(*) FROM events WHERE job_id = ? AND type = 'lease_expired'", (job_id,)
    )
    by_worker = dict(
        reader.rows(
            "SELECT worker, count(*) FROM events WHERE job_id = ? AND type = 'item_claimed' GROUP BY worker",
            (job_id,),
        )
    )
    states = reader.states(job_id)
    ok = succeeded == distinct == n == states.get("succeeded", 0)
    return {
        "ok": ok,
        "item_succeeded_events": succeeded,
        "items_with_a_success": distinct,
        "items": n,
        "states": states,
        "claims": claims,
        "leases_expired": expired,
        "claims_by_worker": by_worker,
    }


def run_job(ctx: BenchContext, store: str, n: int) -> dict[str, Any]:
    """The job through two hosts; its figures (see the module's docstring)."""
    from photojobs.api import Client
    from photojobs.broker import RedisPublisher, build_broker
    from photojobs.config import Settings
    from store.engine import make_engine
    from store.lanes import all_lanes

    t0 = time.perf_counter()
    folder = make_tree(ctx.workdir / f"million-{n}", n)
    warm = make_tree(ctx.workdir / "million-warm", 400)
    made_s = time.perf_counter() - t0
    url = ctx.dbs.create(store, NAME)
    client = engine = broker = reader = None
    hosts: dict[str, Any] = {}
    try:
        ctx.redis.flush()
        base_env = ctx.photojobs_env(url, PHOTOJOBS_FLEET_PROCESSES="2")
        cmd = ctx.product_command(1, THREADS)

        def start(host: str) -> Any:
            env = {**base_env, "PHOTOJOBS_RUNTIME_DIR": str(ctx.workdir / f"runtime-{host}")}
            return ctx.start_product(env, cmd)

        keys = ["PHOTOJOBS_DATABASE_URL", "PHOTOJOBS_REDIS_URL", "PHOTOJOBS_FLEET_PROCESSES"]
        ctx.note(command="each host (A, B): PHOTOJOBS_RUNTIME_DIR=<own> " + command_line(cmd, base_env, keys))
        since = now_ms()
        hosts = {"A": start("A"), "B": start("B")}
        ctx.wait_workers_ready(list(hosts.values()), since, 2)
        settings = Settings.from_env(base_env)
        client = Client(settings, migrate=False)
        reader = Reader(url)
        engine = make_engine(url)
        broker = build_broker(ctx.redis.url)
        specs = all_lanes({})
        publisher = RedisPublisher(broker, specs)
        params = {"noop.sleep": "0"}

        def alive() -> None:
            for name, p in hosts.items():
                if p.poll() is not None:
                    raise BenchmarkError(f"host {name} exited with {p.returncode}: {ctx.procs.tail(p)}")

        def unfinished(job_id: int) -> bool:
            return any(
                reader.scalar(
                    "SELECT 1 FROM items WHERE job_id = ? AND lane = 'noop' AND state = ? LIMIT 1",
                    (job_id, s),
                )
                for s in UNFINISHED
            )

        warm_job = client.submit(["noop"], [warm], params)
        wait_for(lambda: (alive(), not unfinished(warm_job.job_id))[1], 300, 0.2, "the warm-up job")

        tracker = CpuTracker(
            {
                "workers (2 hosts)": lambda: [pid for p in hosts.values() for pid in cpu.tree(p.pid)],
                "postgres backends": _backends(reader),
                "redis": lambda: [ctx.redis.proc.pid] if ctx.redis.proc else [],
            }
        )
        tracker.start()
        load0 = cpu.loadavg()
        busy0 = cpu.machine_busy()
        submit_cmd = [
            sys.executable,
            "-m",
            "photojobs",
            "submit",
            "--lanes",
            "noop",
            "--param",
            "noop.sleep=0",
        ]
        submit_cmd += ["--json", str(folder)]
        ctx.note(command="submit: " + command_line(submit_cmd, base_env, keys[:2]))
        t_submit = time.time()
        proc = ctx.procs.spawn("submit", submit_cmd, base_env)
        deadline = time.monotonic() + 600 + n / 200
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                raise BenchmarkError("the submission did not finish in time")
            tracker.sample()
            time.sleep(0.1)
        t_commit = time.time()
        tracker.sample()
        at_commit = tracker.totals()  # the submission's share (its backend, the fleet idling)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out = ctx.procs.tail(proc, 20_000)
        if proc.returncode != 0:
            raise BenchmarkError(f"photojobs submit exited with {proc.returncode}: {out[-2000:]}")
        import json

        job = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
        job_id, items = int(job["job"]), int(job["items"])
        if items != n:
            raise BenchmarkError(f"submitted {items} items, expected {n}")
        submit_cpu = usage.ru_utime + usage.ru_stime
        # The submission's commit by the database clock (the child's exit comes a little later).
        t_commit = (
            reader.scalar("SELECT at FROM events WHERE job_id = ? AND type = 'job_submitted'", (job_id,))
            or t_commit
        )
        lo, hi = reader.rows("SELECT min(id), max(id) FROM items WHERE job_id = ?", (job_id,))[0]
        middle = lo + (hi - lo) // 2

        killed_at = restarted_at = None
        killed_pids: list[int] = []
        passes_half: dict[str, float] = {}
        t_end = time.monotonic() + 600 + n / 100
        while True:
            time.sleep(POLL_S)
            tracker.sample()
            alive()
            if time.monotonic() > t_end:
                raise BenchmarkError(f"job {job_id} did not finish in time: {reader.states(job_id)}")
            if killed_at is None:
                if reader.scalar("SELECT state FROM items WHERE id = ?", (middle,)) == "succeeded":
                    passes_half = _pass_times(engine, specs, publisher, passes=1)
                    tracker.sample()
                    killed_pids = cpu.tree(hosts["B"].pid)
                    killed_at = time.time()
                    ctx.procs.kill(hosts["B"])
                    wait_for(
                        lambda pids=killed_pids: not [p for p in pids if _alive(p)],
                        10,
                        0.05,
                        "host B's processes to die",
                    )
                    hosts["B"] = start("B")
                    restarted_at = time.time()
                continue
            if reader.scalar(
                "SELECT 1 FROM items WHERE job_id = ? AND lane = 'noop' AND state = 'failed' LIMIT 1",
                (job_id,),
            ):
                raise BenchmarkError(f"job {job_id} has failed items")
            if not unfinished(job_id):
                break
        tracker.sample()
        busy1 = cpu.machine_busy()
        load1 = cpu.loadavg()
        cpu_s = {k: round(v - at_commit.get(k, 0.0), 3) for k, v in tracker.totals().items()}

        done = [
            r[0]
            for r in reader.rows(
                "SELECT at FROM events WHERE job_id = ? AND type = 'item_succeeded' ORDER BY at", (job_id,)
            )
        ]
        first_dispatch = reader.scalar(
            "SELECT min(at) FROM events WHERE job_id = ? AND type = 'item_queued'", (job_id,)
        )
        a, b = done[len(done) // 10], done[(len(done) * 9) // 10]
        steady = ((len(done) * 9) // 10 - len(done) // 10) / (b - a) if b > a else float("nan")
        once = _exactly_once(reader, job_id, n)
        # The killed host's workers claimed nothing after the kill (their ids are host:pid:nonce).
        last_claims = reader.rows(
            "SELECT worker, max(at) FROM events WHERE job_id = ? AND type = 'item_claimed' GROUP BY worker",
            (job_id,),
        )
        once["claims_by_killed_after_kill"] = sum(
            1
            for worker, at in last_claims
            if killed_at and at > killed_at + 0.5 and int(str(worker).split(":")[1]) in killed_pids
        )
        once["ok"] = once["ok"] and once["claims_by_killed_after_kill"] == 0
        first_claims = reader.rows(
            "SELECT min(at) FROM events WHERE job_id = ? AND type = 'item_claimed' GROUP BY worker", (job_id,)
        )
        back = [at for (at,) in first_claims if killed_at and at > killed_at]
        passes_end = _pass_times(engine, specs, publisher)
        size = _store_size(reader)
        ours = sum(cpu_s.values())
        window = done[-1] - t_commit
        return {
            "items": n,
            "files_made_s": round(made_s, 1),
            "submit_s": round(t_commit - t_submit, 2),
            "submit_cpu_s": round(submit_cpu, 2),
            "submit_cpu_s_others": at_commit,  # the fleet and the backends during the submission
            "commit_to_first_dispatch_s": round(first_dispatch - t_commit, 3) if first_dispatch else None,
            "run_s": round(window, 1),
            "rate": round(n / window, 1),
            "steady_rate_p10_p90": round(steady, 1),
            "tenths": _tenths(done),
            "killed_at_s": round(killed_at - t_commit, 1) if killed_at else None,
            "restart_s": round(restarted_at - killed_at, 2) if killed_at and restarted_at else None,
            # host B's new worker's first claim after the kill (its start under the machine's load)
            "b_back_after_kill_s": round(min(back) - killed_at, 1) if back else None,
            "cpu_s": cpu_s,
            "cpu_s_per_1000": {k: round(v * 1000 / n, 3) for k, v in cpu_s.items()},
            "cpu_s_per_1000_total": round(ours * 1000 / n, 3),
            "cores_busy_ours": round(ours / window, 2),
            "cores_busy_others": round(max(0.0, (busy1 - busy0) - ours - submit_cpu) / window, 2),
            "loadavg": (round(load0, 2), round(load1, 2)),
            "sweep_pass_ms_half": passes_half,
            "sweep_pass_ms_end": passes_end,
            "store": size,
            "exactly_once": once,
        }
    finally:
        for p in hosts.values():
            ctx.procs.kill(p)
        if broker is not None:
            broker.close()
        if engine is not None:
            engine.dispose()
        if reader is not None:
            reader.close()
        ctx.end_run([], client, url)
        subprocess.run(["rm", "-rf", str(ctx.workdir / f"million-{n}")], check=False)


@register(
    NAME,
    "A million photos across two hosts on PostgreSQL, one SIGKILLed at half-way (issue 32)",
    default=False,
)
def million(ctx: BenchContext) -> list[Row]:
    """Plain Dramatiq, the big job through two hosts, plain Dramatiq again."""
    n, n_plain = sizes(ctx)
    stores = [s for s in ctx.config.stores if s == "postgresql"] or ctx.config.stores[:1]
    ctx.note(
        settings={
            "items": n,
            "plain messages (each of 2 runs)": n_plain,
            "hosts": "2 x (1 process x 4 threads)",
        }
    )
    rows: list[Row] = []
    plain_before = run_plain(ctx, n_plain)
    for store in stores:
        try:
            f = run_job(ctx, store, n)
        except BenchmarkError as exc:
            rows.append(failed_row(NAME, f"photojobs {store}", "steady rate", exc))
            continue
        plain_after = run_plain(ctx, n_plain)
        rows += _rows(store, f, plain_before, plain_after)
    return rows


def _plain_cpu(m: Any) -> float:
    """Plain Dramatiq's CPU seconds per 1,000 messages (workers + Redis)."""
    return round(sum(v for k, v in m.cpu_ms.items() if k in ("workers", "redis")), 3)


def _rows(store: str, f: dict[str, Any], before: Any, after: Any) -> list[Row]:
    case = f"photojobs {store}, 2 hosts x 1 x {THREADS}, {f['items']:,} items"
    plain_rates = [m.figures["steady_rate"] or m.rate for m in (before, after)]
    plain = statistics.fmean(plain_rates)
    plain_cpu = statistics.fmean([_plain_cpu(before), _plain_cpu(after)])
    load = f"load {f['loadavg'][0]}->{f['loadavg'][1]}, others {f['cores_busy_others']} cores"
    steady = f["steady_rate_p10_p90"]
    tenths = f["tenths"]
    last_first = tenths[-1] / tenths[0] if tenths[0] else float("nan")
    once = f["exactly_once"]
    per = f["cpu_s_per_1000"]
    rows = [
        Row(
            NAME,
            case,
            "steady rate (10-90 % of successes)",
            steady,
            "items/s",
            goal=f">= {GOAL_STEADY}x plain",
            verdict="met" if steady >= GOAL_STEADY * plain else "missed",
            baseline=f"plain Dramatiq 2 x 4 {plain:.1f} msg/s "
            f"({plain_rates[0]:.0f} before, {plain_rates[1]:.0f} after)",
            ratio=round(steady / plain, 3),
            load=load,
            note=f"whole job {f['rate']} items/s in {f['run_s']} s; host B killed at {f['killed_at_s']} s, "
            f"claiming again {f['b_back_after_kill_s']} s later",
            detail=f,
        ),
        Row(
            NAME,
            case,
            "last tenth / first tenth",
            round(last_first, 3),
            "x",
            goal=f">= {GOAL_LAST_TENTH}x",
            verdict="met" if last_first >= GOAL_LAST_TENTH else "missed",
            note="items/s per tenth: " + ", ".join(f"{t:.0f}" for t in tenths),
        ),
        Row(
            NAME,
            case,
            "submission (photojobs submit)",
            f["submit_s"],
            "s",
            goal=f"<= {GOAL_SUBMIT_S:.0f} s at 1M" if f["items"] >= 1_000_000 else "",
            verdict=("met" if f["submit_s"] <= GOAL_SUBMIT_S else "missed")
            if f["items"] >= 1_000_000
            else "",
            note=f"its CPU {f['submit_cpu_s']} s, meanwhile "
            + ", ".join(f"{k} {v} s" for k, v in f["submit_cpu_s_others"].items())
            + "; "
            f"commit -> first dispatch {f['commit_to_first_dispatch_s']} s",
        ),
        Row(
            NAME,
            case,
            "CPU s per 1,000 items (load-proof)",
            f["cpu_s_per_1000_total"],
            "s",
            baseline=f"plain Dramatiq {plain_cpu:.3f} s (workers + Redis)",
            ratio=round(f["cpu_s_per_1000_total"] / plain_cpu, 2) if plain_cpu else None,
            note=", ".join(f"{k} {v:.3f}" for k, v in per.items()) + f"; {f['cores_busy_ours']} cores busy",
        ),
        Row(
            NAME,
            case,
            "sweep pass, at the end (median of 3)",
            f["sweep_pass_ms_end"].get("pass"),
            "ms",
            note="per duty: "
            + ", ".join(f"{k} {v}" for k, v in f["sweep_pass_ms_end"].items() if k != "pass")
            + f"; at half-way {f['sweep_pass_ms_half'].get('pass')} ms",
        ),
        Row(
            NAME,
            case,
            "store size at the end",
            f["store"]["database_mib"],
            "MiB",
            note=", ".join(
                f"{k} {v}" for k, v in f["store"].items() if k.endswith("_mib") and k != "database_mib"
            )
            + "; dead rows "
            + ", ".join(
                f"{t} {s['dead']:,} ({s['autovacuums']} autovacuums, {s.get('vacuums', 0)} by the sweeper)"
                for t, s in f["store"]["tables"].items()
            ),
        ),
        Row(
            NAME,
            case,
            "exactly once (event log)",
            "yes" if once["ok"] else "NO",
            verdict="met" if once["ok"] else "missed",
            goal="every item one item_succeeded",
            note=f"{once['item_succeeded_events']:,} successes of {once['items']:,} items "
            f"({once['items_with_a_success']:,} distinct); {once['claims']:,} claims, "
            f"{once['leases_expired']} leases expired; host B's killed workers' claims after the kill: "
            f"{once['claims_by_killed_after_kill']}; claims by worker process: "
            + ", ".join(f"{n:,}" for n in once["claims_by_worker"].values()),
        ),
    ]
    return rows
