"""No-op throughput: plain Dramatiq against photojobs' ``noop`` lane on SQLite and PostgreSQL.

Same machine, same private Redis, same P worker processes x T threads, same N, measured in one run.

- plain: ``dramatiq benchmarks.plain_actors --processes P --threads T``; N messages sent with
  ``actor.send``; messages/s from just before the first send to the last completion.
- photojobs: P ``dramatiq actors --processes 1 --threads T`` workers and one ``photojobs sweep``
  (the bench's own fleet; ``benchmarks.goals`` measures ``photojobs worker`` as users start it);
  a job of N items submitted with ``Client.submit``; items/s from the submission's commit to the
  last ``item_succeeded`` (database clock), so dispatch is included.

Each measurement follows a warm-up batch through the same processes (connections, imports).

:func:`run_photojobs` (any lane, any folder, extra environment) and :func:`summary_rows` are also
the harness of the ``locks`` and ``analysis`` benchmarks.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import cpu
from .harness import (
    BenchContext,
    BenchmarkError,
    command_line,
    failed_row,
    now_ms,
    wait_for,
)
from .reader import Reader
from .registry import Row, register

NAME = "noop"
GOAL_RATIO = 0.6
TERMINAL = ("succeeded", "failed", "cancelled", "skipped")
POLL_S = 0.25  # seconds between the harness's looks at a measured job (its end comes from its events)


@dataclass
class Measured:
    """One throughput case: ``count`` messages/items in ``seconds``, plus its breakdown."""

    case: str
    count: int
    seconds: float
    figures: dict[str, Any] = field(default_factory=dict)
    cpu_ms: dict[str, float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        """Messages or items per second."""
        return self.count / self.seconds if self.seconds > 0 else float("nan")


def _deadline(n: int, per_second: float) -> float:
    return 60.0 + n / per_second


def _add_others(before: dict[str, float], after: dict[str, float], busy0: float, busy1: float) -> None:
    """Add "other processes": the machine's busy CPU in the window minus what the labels account for."""
    ours = sum(cpu.delta(before, after).values())
    before["other processes"], after["other processes"] = 0.0, max(0.0, (busy1 - busy0) - ours)


def _cpu_per_item(before: dict[str, float], after: dict[str, float], n: int) -> dict[str, float]:
    return {k: round(v * 1000 / n, 3) for k, v in cpu.delta(before, after).items()}


def run_plain(ctx: BenchContext, items: int | None = None, *, flush: bool = True) -> Measured:
    """The baseline: plain Dramatiq, a no-op actor, same Redis, P processes x T threads; ``items``
    messages (default ``--items``); ``flush`` False keeps Redis's keys (a photojobs fleet's queues
    beside it)."""
    from dramatiq.brokers.redis import RedisBroker

    from . import plain_actors

    cfg = ctx.config
    n_items = items or cfg.items
    if flush:
        ctx.redis.flush()
    env = {
        **ctx.photojobs_env("unused"),
        "PJBENCH_REDIS_URL": ctx.redis.url,
        "dramatiq_queue_prefetch": str(2 * cfg.threads),  # as photojobs workers use
    }
    cmd = [
        sys.executable,
        "-m",
        "dramatiq",
        "benchmarks.plain_actors",
        "--processes",
        str(cfg.processes),
        "--threads",
        str(cfg.threads),
        "--queues",
        plain_actors.QUEUE,
    ]
    ctx.note(command="plain: " + command_line(cmd, env, ["PJBENCH_REDIS_URL", "dramatiq_queue_prefetch"]))
    since = now_ms()
    proc = ctx.procs.spawn("plain", cmd, env)
    broker = RedisBroker(url=ctx.redis.url)
    try:
        ctx.wait_workers_ready([proc], since, cfg.processes)
        actor = plain_actors.declare(broker)
        r = ctx.redis.client()

        def batch(n: int) -> tuple[float, float, float, float]:
            run = uuid.uuid4().hex[:10]
            count_key, first_key, last_key = plain_actors.keys(run)
            t0 = time.time()
            for _ in range(n):
                actor.send(run, n)
            t_sent = time.time()

            def done() -> bool:
                if proc.poll() is not None:
                    raise BenchmarkError(f"plain dramatiq exited: {ctx.procs.tail(proc)}")
                return int(r.get(count_key) or 0) >= n

            wait_for(done, _deadline(n, 50), interval=0.02, what=f"{n} plain messages")
            last = float(wait_for(lambda: r.get(last_key), 10, what="the last completion stamp"))
            first = float(r.get(first_key))
            return t0, t_sent, first, last

        batch(cfg.warmup)
        groups = {"workers": [proc.pid], "redis": [ctx.redis.proc.pid] if ctx.redis.proc else []}
        load0 = cpu.loadavg()
        before, bench_before, busy_before = cpu.snapshot(groups), cpu.self_cpu(), cpu.machine_busy()
        t0, t_sent, first, last = batch(n_items)
        after, bench_after, busy_after = cpu.snapshot(groups), cpu.self_cpu(), cpu.machine_busy()
        load1 = cpu.loadavg()
    finally:
        ctx.procs.kill(proc)
        broker.close()
    before["benchmark (send+poll)"], after["benchmark (send+poll)"] = bench_before, bench_after
    _add_others(before, after, busy_before, busy_after)
    n = n_items
    return Measured(
        case="plain dramatiq",
        count=n,
        seconds=last - t0,
        figures={
            "enqueue_s": round(t_sent - t0, 3),
            "first_completion_s": round(first - t0, 3),
            "steady_rate": round((n - 1) / (last - first), 1) if last > first else None,
            "loadavg": (round(load0, 2), round(load1, 2)),
        },
        cpu_ms=_cpu_per_item(before, after, n),
    )


def _event_figures(reader: Reader, job_id: int, t_commit: float) -> dict[str, Any]:
    rows = reader.rows(
        "SELECT type, item_id, at FROM events WHERE job_id = ? AND type IN "
        "('item_queued', 'item_claimed', 'item_succeeded', 'item_deferred') ORDER BY id",
        (job_id,),
    )
    queued: dict[int, float] = {}
    claimed: dict[int, float] = {}
    succeeded: dict[int, float] = {}
    claims = deferred = 0
    for type_, item, at in rows:
        if type_ == "item_deferred":
            deferred += 1
        elif type_ == "item_queued":
            queued.setdefault(item, at)
        elif type_ == "item_claimed":
            claims += 1
            claimed.setdefault(item, at)
        else:
            succeeded[item] = at
    if not succeeded:
        raise BenchmarkError(f"job {job_id} has no item_succeeded events")
    done = sorted(succeeded.values())
    waits = [claimed[i] - queued[i] for i in claimed if i in queued]
    runs = [succeeded[i] - claimed[i] for i in succeeded if i in claimed]
    lo, hi = done[len(done) // 10], done[(len(done) * 9) // 10]
    steady = ((len(done) * 9) // 10 - len(done) // 10) / (hi - lo) if hi > lo else None

    def ms(xs: list[float], q: float | None = None) -> float | None:
        if not xs:
            return None
        if q is None:
            return round(statistics.fmean(xs) * 1000, 2)
        return round(sorted(xs)[min(len(xs) - 1, int(len(xs) * q))] * 1000, 2)

    return {
        "last_succeeded_at": done[-1],
        "commit_to_first_queued_s": round(min(queued.values()) - t_commit, 3) if queued else None,
        "commit_to_first_succeeded_s": round(done[0] - t_commit, 3),
        "steady_rate_p10_p90": round(steady, 1) if steady else None,
        "wait_in_redis_ms_mean": ms(waits),
        "wait_in_redis_ms_p95": ms(waits, 0.95),
        "claim_to_succeeded_ms_mean": ms(runs),
        "claim_to_succeeded_ms_p95": ms(runs, 0.95),
        "extra_claims": claims - len(claimed),
        "deferred": deferred,
    }


def _pg_backends(reader: Reader) -> list[int]:
    """Pids of the PostgreSQL backends connected to the reader's database (none on SQLite)."""
    if reader.sqlite:
        return []
    return [r[0] for r in reader.rows("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]


def run_photojobs(
    ctx: BenchContext,
    store: str,
    *,
    lane: str = "noop",
    folder: Path | None = None,
    warm_folder: Path | None = None,
    threads: int | None = None,
    extra: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    label: str = "",
    note_commands: bool = True,
    shape: str = "harness",
    lanes_arg: str | None = None,
) -> Measured:
    """One lane's job through a fleet (see :func:`run_photojobs_many`, which this calls with no more)."""
    return run_photojobs_many(
        ctx,
        store,
        lane=lane,
        folder=folder,
        warm_folder=warm_folder,
        threads=threads,
        extra=extra,
        params=params,
        label=label,
        note_commands=note_commands,
        shape=shape,
        lanes_arg=lanes_arg,
    )[0]


@dataclass
class Job:
    """A further job through the same fleet: ``before()`` runs first, while the fleet is idle."""

    lane: str
    folder: Path
    warm_folder: Path
    params: Mapping[str, str] = field(default_factory=dict)
    before: Callable[[], Any] | None = None
    label: str = ""


def run_photojobs_many(
    ctx: BenchContext,
    store: str,
    *,
    lane: str = "noop",
    folder: Path | None = None,
    warm_folder: Path | None = None,
    threads: int | None = None,
    extra: Mapping[str, str] | None = None,
    params: Mapping[str, str] | None = None,
    label: str = "",
    note_commands: bool = True,
    shape: str = "harness",
    lanes_arg: str | None = None,
    more: Sequence[Job] = (),
) -> list[Measured]:
    """One photojobs lane: P workers x T threads plus one sweeper, a job of the ``folder``'s files.

    By default the noop lane with ``noop.sleep=0`` on N empty files (``--items``). ``extra`` adds
    environment variables to every process of the run (workers, sweeper, the submitting client):
    e.g. ``PHOTOJOBS_LANE_NOOP_LOCK=X``. Measured from the submission's commit to the last
    ``item_succeeded`` (database clock), after a warm-up job through the same processes.

    ``shape="product"`` runs the fleet as users start it instead: one ``photojobs worker
    --processes P --threads T`` (a supervisor with its in-process sweeper, each worker its own
    ``photojobs.dramatiq_worker actors`` process; ``--lanes lanes_arg`` when given, else every lane,
    the command's default), with no ``PHOTOJOBS_FLEET_PROCESSES`` / ``PHOTOJOBS_LANE_*_THREADS``
    set unless ``extra`` sets them. Its CPU is that of the supervisor's process tree.
    """
    from photojobs.api import Client
    from photojobs.config import Settings

    cfg = ctx.config
    threads = threads or cfg.threads
    if params is None:
        params = {"noop.sleep": "0"} if lane == "noop" else {}
    if folder is None:
        folder = ctx.folder("noop", cfg.items)
    if warm_folder is None:
        warm_folder = ctx.folder("warm", cfg.warmup_for(cfg.items, threads))
    queue = f"photojobs.{lane}"
    url = ctx.dbs.create(store, lane)
    client = None
    procs = []
    try:
        ctx.redis.flush()
        env_extra: dict[str, str] = {}
        if shape == "harness":
            env_extra["PHOTOJOBS_FLEET_PROCESSES"] = str(cfg.processes)
            env_extra[f"PHOTOJOBS_LANE_{lane.upper()}_THREADS"] = str(threads)
        if cfg.bound and lane == "noop":
            env_extra["PHOTOJOBS_LANE_NOOP_BOUND"] = str(cfg.bound)
        env_extra.update(extra or {})
        env = ctx.photojobs_env(url, **env_extra)
        keys = ["PHOTOJOBS_DATABASE_URL", "PHOTOJOBS_REDIS_URL", *env_extra]
        who = f"photojobs{label}"
        since = now_ms()
        if shape == "product":
            env["PHOTOJOBS_RUNTIME_DIR"] = str(ctx.workdir / "runtime")  # this run's fleet records only
            cmd = ctx.product_command(cfg.processes, threads, lanes_arg)
            if note_commands:
                ctx.note(command=f"{who}: " + command_line(cmd, env, keys))
            supervisor = ctx.start_product(env, cmd)
            procs.append(supervisor)
            workers = [supervisor]
            ctx.wait_workers_ready(workers, since, cfg.processes)
        else:
            worker_env = {**env, "dramatiq_queue_prefetch": str(2 * threads)}  # as photojobs worker
            if note_commands:
                ctx.note(
                    command=f"{who} ({cfg.processes}x): "
                    + command_line(
                        ctx.worker_command(threads, queue), worker_env, [*keys, "dramatiq_queue_prefetch"]
                    )
                )
                sweep = [sys.executable, "-m", "photojobs", "sweep"]
                ctx.note(command=f"{who} sweeper: " + command_line(sweep, env, keys))
            workers = [ctx.start_worker(env, threads, queue) for _ in range(cfg.processes)]
            procs.extend(workers)
            sweeper = ctx.start_sweeper(env)  # boots alongside the workers; no job to dispatch yet
            procs.append(sweeper)
            ctx.wait_workers_ready(workers, since, cfg.processes)
        settings = Settings.from_env(env)
        client = Client(settings, migrate=False)
        reader = Reader(url)

        def finish(job_id: int, n: int) -> None:
            def done() -> bool:
                for p in procs:
                    if p.poll() is not None:
                        raise BenchmarkError(f"{p.args} exited with {p.returncode}: {ctx.procs.tail(p)}")
                states = reader.states(job_id)
                if states.get("failed"):
                    raise BenchmarkError(f"job {job_id} has failed items: {states}")
                return sum(states.get(s, 0) for s in TERMINAL) >= n

            # The job's end is read from its events (database clock), so a slower poll only costs
            # the fleet less CPU: a count over the job's items every 50 ms took 0.23 ms per photo
            # of a 3,000-photo job from the cores photojobs is measured on.
            wait_for(done, _deadline(n, 10), interval=POLL_S, what=f"{n} items of job {job_id} ({store})")

        def measure(
            lane: str, folder: Path, warm_folder: Path, params: Mapping[str, str], label: str
        ) -> Measured:
            warm = client.submit([lane], [warm_folder], params)
            finish(warm.job_id, warm.items)
            redis_pids = [ctx.redis.proc.pid] if ctx.redis.proc else []
            fleet: dict[str, list[int]] = {}
            if shape == "product":
                groups = {"redis": redis_pids}
                tree = cpu.tree(supervisor.pid)
                fleet = {"supervisor + sweeper": [supervisor.pid], "workers": tree[1:]}
            else:
                groups = {"workers": [p.pid for p in workers], "sweeper": [sweeper.pid], "redis": redis_pids}
            backends = set(_pg_backends(reader))
            t_submit = time.time()
            submitted = client.submit([lane], [folder], params)
            t_commit = time.time()
            backends.update(_pg_backends(reader))
            pids = {**fleet, "postgres backends": backends} if store == "postgresql" else dict(fleet)
            load0 = cpu.loadavg()
            before, bench_before, busy_before = (
                cpu.snapshot(groups, {}, pids),
                cpu.self_cpu(),
                cpu.machine_busy(),
            )
            finish(submitted.job_id, submitted.items)
            # A backend opened during the window counts from its start; one that ended is lost (rare: pools).
            if store == "postgresql":
                pids["postgres backends"] = backends | set(_pg_backends(reader))
            after, bench_after, busy_after = (
                cpu.snapshot(groups, {}, pids),
                cpu.self_cpu(),
                cpu.machine_busy(),
            )
            load1 = cpu.loadavg()
            before["benchmark (poll)"], after["benchmark (poll)"] = bench_before, bench_after
            _add_others(before, after, busy_before, busy_after)
            figures = _event_figures(reader, submitted.job_id, t_commit)
            spec = client.specs[lane]
            figures["submit_s"] = round(t_commit - t_submit, 3)
            figures["loadavg"] = (round(load0, 2), round(load1, 2))
            figures["shape"] = shape
            figures["sweep_interval_s"] = settings.sweep_interval
            figures["bound"] = spec.effective_bound
            figures["lock"] = spec.lock or "none"
            last = figures.pop("last_succeeded_at")
            return Measured(
                case=f"photojobs {store}{label}",
                count=submitted.items,
                seconds=last - t_commit,
                figures=figures,
                cpu_ms=_cpu_per_item(before, after, submitted.items),
            )

        results = [measure(lane, folder, warm_folder, params, label)]
        for job in more:
            if job.before is not None:
                job.before()
            results.append(measure(job.lane, job.folder, job.warm_folder, job.params, job.label or label))
        reader.close()
    finally:
        ctx.end_run(procs, client, url)
    return results


def _cpu_text(cpu_ms: dict[str, float], count: int, seconds: float) -> str:
    ours = {k: v for k, v in cpu_ms.items() if v and k != "other processes"}
    text = ", ".join(f"{k} {v:.2f}" for k, v in ours.items()) or "-"
    cores = sum(ours.values()) * count / 1000 / seconds
    others = cpu_ms.get("other processes", 0.0) * count / 1000 / seconds
    return f"{text}; {cores:.2f} cores busy (other processes on the machine: {others:.2f} cores)"


def cpu_row(bench: str, m: Measured, unit: str = "item") -> Row:
    """``CPU per <unit>``: the run's processes (not other processes on the machine), with the split."""
    others = m.cpu_ms.get("other processes", 0.0)
    total = sum(m.cpu_ms.values()) - others
    return Row(
        bench,
        m.case,
        f"CPU per {unit}",
        round(total, 2),
        "ms",
        note=_cpu_text(m.cpu_ms, m.count, m.seconds),
        detail={
            "cpu_ms_per_item": m.cpu_ms,
            "cpu_cores_used_by_the_run": round(total * m.count / 1000 / m.seconds, 2),
            "cpu_cores_used_by_other_processes": round(others * m.count / 1000 / m.seconds, 2),
        },
    )


def summary_rows(bench: str, m: Measured, unit: str = "item") -> list[Row]:
    """Two rows of a photojobs run: its throughput (the timeline in the note) and its CPU per item."""
    f = m.figures
    note = (
        f"steady {f['steady_rate_p10_p90']}/s; commit -> first dispatch {f['commit_to_first_queued_s']} s, "
        f"-> first success {f['commit_to_first_succeeded_s']} s; wait in Redis "
        f"{f['wait_in_redis_ms_mean']} ms, claimed -> succeeded {f['claim_to_succeeded_ms_mean']} / "
        f"p95 {f['claim_to_succeeded_ms_p95']} ms; bound {f['bound']}, lock {f['lock']}"
    )
    if f.get("deferred"):
        note += f"; {f['deferred']} deferred (photo locked)"
    detail = {"items": m.count, "seconds": round(m.seconds, 3), **f}
    return [
        Row(bench, m.case, "throughput", round(m.rate, 1), f"{unit}s/s", note=note, detail=detail),
        cpu_row(bench, m, unit),
    ]


def _rows(m: Measured, unit: str) -> list[Row]:
    f = m.figures
    rows = [
        Row(
            NAME, m.case, "throughput", round(m.rate, 1), f"{unit}/s", detail={"seconds": round(m.seconds, 3)}
        ),
    ]
    if m.case == "plain dramatiq":
        rows.append(Row(NAME, m.case, "enqueue time (in the window)", f["enqueue_s"], "s"))
        rows.append(
            Row(NAME, m.case, "steady rate (first -> last completion)", f["steady_rate"], f"{unit}/s")
        )
    else:
        rows += [
            Row(NAME, m.case, "submit (not in the window)", f["submit_s"], "s"),
            Row(
                NAME,
                m.case,
                "commit -> first dispatch",
                f["commit_to_first_queued_s"],
                "s",
                note=f"sweep interval {f['sweep_interval_s']} s",
            ),
            Row(NAME, m.case, "commit -> first success", f["commit_to_first_succeeded_s"], "s"),
            Row(NAME, m.case, "steady rate (10%-90% of successes)", f["steady_rate_p10_p90"], f"{unit}/s"),
            Row(
                NAME,
                m.case,
                "wait in Redis (queued -> claimed) mean/p95",
                f"{f['wait_in_redis_ms_mean']} / {f['wait_in_redis_ms_p95']}",
                "ms",
                note=f"bound {f['bound']}",
            ),
            Row(
                NAME,
                m.case,
                "claimed -> succeeded mean/p95",
                f"{f['claim_to_succeeded_ms_mean']} / {f['claim_to_succeeded_ms_p95']}",
                "ms",
            ),
        ]
        if f["extra_claims"]:
            rows.append(Row(NAME, m.case, "claims beyond one per item", f["extra_claims"], ""))
    rows.append(cpu_row(NAME, m))
    return rows


@register(
    NAME,
    "No-op throughput: plain Dramatiq vs the bench harness fleet (dramatiq actors + sweep)",
    default=False,  # the goal rows measure `photojobs worker`; `shapes` compares both fleets
)
def noop_throughput(ctx: BenchContext) -> list[Row]:
    """Plain Dramatiq, then photojobs on each store; rows with rates, ratios and breakdowns."""
    cfg = ctx.config
    ctx.note(
        settings={
            "processes": cfg.processes,
            "threads": cfg.threads,
            "items": cfg.items,
            "warmup": cfg.warmup,
            "prefetch": 2 * cfg.threads,
            "noop.sleep": 0,
            "lane bound": cfg.bound or f"runtime default 2*T*P = {2 * cfg.threads * cfg.processes}",
        }
    )
    plain = run_plain(ctx)
    rows = _rows(plain, "msg")
    for store in cfg.stores:
        try:
            m = run_photojobs(ctx, store)
        except BenchmarkError as exc:
            rows.append(failed_row(NAME, f"photojobs {store}", "throughput", exc))
            continue
        rows += _rows(m, "items")
        ratio = m.rate / plain.rate
        rows.append(
            Row(
                NAME,
                m.case,
                "ratio photojobs / plain",
                round(ratio, 3),
                "x",
                goal=f">= {GOAL_RATIO}x" if store == "sqlite" else "",
                verdict=("met" if ratio >= GOAL_RATIO else "missed") if store == "sqlite" else "",
            )
        )
    return rows
