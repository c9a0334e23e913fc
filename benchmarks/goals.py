"""The goal rows of issue 9, each against a baseline measured in the same run, with the machine's load.

- no-op items/s, SQLite / PostgreSQL (goal >= 0.6x / >= 0.5x): ``photojobs worker --processes P
  --threads T`` as users run it (a supervisor with its in-process sweeper; every lane, the
  command's default) on N no-op items, from the submission's commit to the last success; against
  plain Dramatiq actors of the same shape (P processes x T threads) on the same Redis.
- store CPU per item, SQLite (goal <= 1.5 ms): :mod:`benchmarks.probe`, an instrumented worker
  process with one thread: ``thread_time`` of the claim hooks + the finish hooks (the top-up's
  dispatch included, its Redis client calls not) + the heartbeat thread's renewals, per item;
  against two empty write transactions through the runtime's engine.
- SQLite write lock held per item, loaded and idle (goal <= 1 ms): the probe's engine events, from
  ``BEGIN IMMEDIATE`` returning to the end of ``COMMIT``/``ROLLBACK``, summed over every write
  transaction of its process, per item it finished. Loaded: the probe (T threads) is one of a
  2-process fleet (the other a plain worker, plus the sweeper); idle: the probe alone, one thread.
- analysis photos/s (goal >= 0.9x): the same ``photojobs worker`` command on the analysis lane
  over ``--photos`` 1600x1200 photos; against ``multiprocessing.Pool(P).map(analyze)`` over the
  same photos, run just before and just after.
- worker CPU per photo (goal <= 1.1x): the worker processes' CPU in that run (``/proc``) against
  the pool's processes'.
- SIGKILL -> running again (goal <= TTL + 1 s): :mod:`benchmarks.recovery` (the lease owner's pid
  from ``lease_owner``), the max over its runs.

"load" on each row: the 1-minute load average at the start and end of its measurement and the CPU
(in cores) that processes outside the run used meanwhile (``/proc/stat`` busy time minus ours).
"""

from __future__ import annotations

import functools
import sys
import time
from pathlib import Path
from typing import Any

from . import cpu
from .analysis import make_photos, pool_stats, run_pool, warm_copy
from .harness import BenchContext, BenchmarkError, StoreUnavailable, command_line, now_ms, wait_for
from .probe import read as read_probe
from .reader import Reader
from .recovery import TTL, recovery_rows
from .registry import Row, register
from .throughput import Job, Measured, run_photojobs, run_photojobs_many, run_plain

NAME = "goals"
NOOP_GOAL = {"sqlite": 0.6, "postgresql": 0.5}
STORE_CPU_GOAL_MS = 1.5
LOCK_GOAL_MS = 1.0
ANALYSIS_GOAL = 0.9
CPU_RATIO_GOAL = 1.1
RECOVERY_GOAL_S = TTL + 1.0
SMALL_PHOTOS = 8  # the analysis goal's photos with --quick


def load_text(load0: float, load1: float, others_cores: float) -> str:
    """``load 7.1->6.9, others 1.52 cores``."""
    return f"load {load0:.1f}->{load1:.1f}, others {others_cores:.2f} cores"


def measured_load(m: Measured) -> str:
    """The load of a throughput measurement (its loadavg figures, its 'other processes' CPU)."""
    l0, l1 = m.figures.get("loadavg", (float("nan"), float("nan")))
    others = m.cpu_ms.get("other processes", 0.0) * m.count / 1000 / m.seconds if m.seconds > 0 else 0.0
    return load_text(l0, l1, others)


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def _missing(figure: str, goal: str, exc: BaseException, verdict: str = "error") -> Row:
    return Row(NAME, "-", figure, None, goal=goal, verdict=verdict, note=str(exc)[:400])


# -- no-op: photojobs worker vs plain Dramatiq ---------------------------------------------------
def _pool_into(ctx: BenchContext, photos: Path, timeout: float, runs: list[dict[str, Any]]) -> None:
    runs.append(run_pool(ctx, photos, timeout))


def analysis_inputs(ctx: BenchContext) -> tuple[int, Path, Path]:
    """The analysis goal's photos: (count, folder, warm-up folder)."""
    cfg = ctx.config
    n = SMALL_PHOTOS if cfg.quick else cfg.photos
    photos = make_photos(ctx, n)
    return n, photos, warm_copy(ctx, photos, cfg.warmup_for(n))


def noop_rows(ctx: BenchContext, shared: dict[str, Any]) -> tuple[list[Row], dict[str, Measured]]:
    """Plain Dramatiq, then ``photojobs worker`` on each store; one goal row per store.

    With ``--quick`` the SQLite fleet also runs the analysis goal's job afterwards (and the pool
    before it, while the fleet idles), into ``shared``: one fleet start-up less."""
    cfg = ctx.config
    plain = run_plain(ctx)
    rows: list[Row] = []
    runs: dict[str, Measured] = {}
    for store in cfg.stores:
        goal = NOOP_GOAL[store]
        figure = f"no-op items/s, {store}, {cfg.processes} procs x {cfg.threads} threads"
        try:
            more = []
            if cfg.quick and store == "sqlite":
                n, photos, warm = analysis_inputs(ctx)
                pool_runs = shared.setdefault("pool_runs", [])
                more.append(
                    Job(
                        "analysis",
                        photos,
                        warm,
                        before=functools.partial(_pool_into, ctx, photos, 120 + n, pool_runs),
                    )
                )
            m, *also = run_photojobs_many(ctx, store, shape="product", label=" (photojobs worker)", more=more)
            if also:
                shared["analysis"] = also[0]
        except StoreUnavailable as exc:
            rows.append(_missing(figure, f">= {goal}x", exc, "skipped"))
            continue
        except BenchmarkError as exc:
            print(f"[benchmarks] {NAME} noop {store}: {exc}", file=sys.stderr)
            rows.append(_missing(figure, f">= {goal}x", exc))
            continue
        runs[store] = m
        ratio = m.rate / plain.rate
        own = {k: v for k, v in m.cpu_ms.items() if k != "other processes" and v}
        rows.append(
            Row(
                NAME,
                "photojobs worker",
                figure,
                round(m.rate, 1),
                "items/s",
                goal=f">= {goal}x",
                verdict=_verdict(ratio >= goal),
                baseline=f"plain Dramatiq {plain.rate:,.1f} msg/s",
                ratio=round(ratio, 3),
                load=measured_load(m),
                note=f"plain's load: {measured_load(plain)}; CPU per item "
                + ", ".join(f"{k} {v:.2f}" for k, v in own.items())
                + f" ms vs plain {sum(v for k, v in plain.cpu_ms.items() if k != 'other processes'):.2f} ms; "
                f"steady {m.figures['steady_rate_p10_p90']}/s; bound {m.figures['bound']}",
                detail={
                    "photojobs": {"seconds": m.seconds, **m.figures, "cpu_ms": m.cpu_ms},
                    "plain": {
                        "rate": round(plain.rate, 1),
                        "seconds": plain.seconds,
                        **plain.figures,
                        "cpu_ms": plain.cpu_ms,
                    },
                },
            )
        )
    return rows, runs


# -- the probe: store CPU and SQLite's write lock per item ---------------------------------------
def run_probe(
    ctx: BenchContext, store: str, threads: int, phases: tuple[bool, ...], items: int
) -> list[dict[str, Any]]:
    """An instrumented worker (:mod:`benchmarks.probe`) with ``threads`` threads and a sweeper; one
    measured job of ``items`` no-op items per phase, each ``True`` phase with a plain worker
    process of ``ctx.config.threads`` threads beside it (started before that phase's warm-up and
    kept after). Returns per-item figures of the probe's process for each phase."""
    from photojobs.api import Client
    from photojobs.cli_support import worker_env
    from photojobs.config import Settings

    url = ctx.dbs.create(store, "probe")
    out = ctx.workdir / f"probe-{time.monotonic_ns()}.json"
    procs = []
    client = None
    results = []
    try:
        ctx.redis.flush()
        env = ctx.photojobs_env(url, PHOTOJOBS_FLEET_PROCESSES="2" if any(phases) else "1")
        cmd = [sys.executable, "-m", "dramatiq", "benchmarks.probe", "--processes", "1"]
        cmd += ["--threads", str(threads), "--queues", "photojobs.noop"]
        probe_env = {**worker_env(threads, env), "PJBENCH_PROBE_OUT": str(out)}
        ctx.note(
            command=f"probe ({threads} thread(s)): "
            + command_line(cmd, probe_env, ["PJBENCH_PROBE_OUT", "PHOTOJOBS_FLEET_PROCESSES"])
        )
        since = now_ms()
        probe = ctx.procs.spawn("probe", cmd, probe_env)
        procs.append(probe)
        sweeper = ctx.start_sweeper(env)
        procs.append(sweeper)
        ctx.wait_workers_ready([probe], since, 1)
        client = Client(Settings.from_env(env), migrate=False)
        reader = Reader(url)
        params = {"noop.sleep": "0"}

        def run_job(folder: Path) -> int:
            job = client.submit(["noop"], [folder], params)

            def done() -> bool:
                for p in procs:
                    if p.poll() is not None:
                        raise BenchmarkError(f"{p.args} exited with {p.returncode}: {ctx.procs.tail(p)}")
                return reader.states(job.job_id).get("succeeded", 0) >= job.items

            wait_for(done, 60 + items / 5, what=f"{job.items} probe items ({store})")
            return job.job_id

        def finished_by(job_id: int | None, worker: str) -> int:
            """Items of ``job_id`` (None: of every job) that the probe's process finished."""
            sql = "SELECT count(*) FROM events WHERE type = 'item_succeeded' AND worker = ?"
            if job_id is None:
                return int(reader.scalar(sql, (worker,)))
            return int(reader.scalar(sql + " AND job_id = ?", (worker, job_id)))

        def counted(at_least: float) -> dict[str, Any] | None:
            now = read_probe(out)
            return now if now and now["worker"] and now["items"] >= at_least else None

        companion = None
        for n, loaded in enumerate(phases):
            if loaded and companion is None:
                since = now_ms()
                companion = ctx.start_worker(env, ctx.config.threads)
                procs.append(companion)
                ctx.wait_workers_ready([companion], since, 2)
            run_job(ctx.folder(f"probe-warm-{n}", max(8, 2 * threads)))
            worker = wait_for(lambda: counted(0), 30, what="the probe's counters")["worker"]
            # The counters are dumped every 0.1 s: wait until they hold every item the probe finished.
            done_so_far = finished_by(None, worker)
            before = wait_for(lambda n=done_so_far: counted(n), 10, what="the probe's warm-up")
            pids = {"run": [p.pid for p in procs] + ([ctx.redis.proc.pid] if ctx.redis.proc else [])}
            load0, busy0, ours0 = cpu.loadavg(), cpu.machine_busy(), sum(cpu.snapshot(pids).values())
            self0 = cpu.self_cpu()
            t0 = time.time()
            # Beside a companion worker with more threads a small job can be taken by it whole:
            # run it again (at most twice more) until the probe has finished some of it.
            mine = 0
            for _ in range(3):
                job_id = run_job(ctx.folder(f"probe-{n}", items))
                mine += finished_by(job_id, worker)
                if mine:
                    break
            seconds = time.time() - t0
            total = before["items"] + mine
            after = wait_for(lambda n=total: counted(n), 10, what="the probe's counters")
            load1, busy1, ours1 = cpu.loadavg(), cpu.machine_busy(), sum(cpu.snapshot(pids).values())
            others = max(0.0, (busy1 - busy0) - (ours1 - ours0) - (cpu.self_cpu() - self0)) / seconds
            got = _per_item(before, after, items, seconds, (load0, load1), others)
            got["probe_threads"], got["companion_threads"] = threads, ctx.config.threads if loaded else 0
            results.append(got)
        reader.close()
    finally:
        ctx.end_run(procs, client, url)
    return results


def _per_item(
    before: dict[str, Any],
    after: dict[str, Any],
    items: int,
    seconds: float,
    loadavg: tuple[float, float],
    others: float,
) -> dict[str, Any]:
    """The probe's counters over a measured job, per item it finished."""
    d = {k: after[k] - before[k] for k in before if isinstance(before[k], int | float)}
    n = d["items"]
    if n < 1:
        raise BenchmarkError("the probe finished no item of the measured job")

    def per(key: str) -> float:
        return 1000 * d[key] / n

    claim, after_hooks = per("cpu_before"), per("cpu_after")
    dispatch, redis_cpu, renew = per("cpu_dispatch"), per("cpu_redis"), per("cpu_heartbeat")
    return {
        "items": int(n),
        "job_items": items,
        "seconds": round(seconds, 3),
        "store_cpu_ms": round(claim + after_hooks - redis_cpu + renew, 3),
        "claim_ms": round(claim, 3),
        "finish_ms": round(after_hooks - dispatch - redis_cpu, 3),
        "dispatch_ms": round(dispatch, 3),
        "renew_ms": round(renew, 3),
        "redis_client_ms": round(redis_cpu, 3),
        "beats": int(d["beats"]),
        "held_ms": round(per("held_write"), 3),
        "held_cpu_ms": round(per("held_write_cpu"), 3),
        "write_transactions_per_item": round(d["write_transactions"] / n, 2),
        "read_held_ms": round(per("held_read"), 3),
        "loadavg": (round(loadavg[0], 2), round(loadavg[1], 2)),
        "others_cores": round(others, 2),
    }


def empty_transactions(ctx: BenchContext, store: str, n: int = 200) -> dict[str, float]:
    """CPU and (write-lock) hold time of an empty write transaction through the runtime's engine."""
    from sqlalchemy import event, text

    from store.engine import make_engine

    url = ctx.dbs.create(store, "empty")
    engine = make_engine(url)
    held = [0.0]
    start = [0.0]

    def began(_conn: Any) -> None:
        start[0] = time.perf_counter()

    event.listen(engine, "begin", began)
    commit = engine.dialect.do_commit

    def do_commit(dbapi_conn: Any) -> None:
        commit(dbapi_conn)
        held[0] += time.perf_counter() - start[0]

    engine.dialect.do_commit = do_commit  # type: ignore[method-assign]
    try:
        with engine.begin() as conn:  # connect, pragmas
            conn.execute(text("SELECT 1"))
        held[0] = 0.0
        c0 = time.process_time()
        for _ in range(n):
            with engine.begin() as conn:
                conn.execute(text("SELECT 1"))
        cpu_ms = 1000 * (time.process_time() - c0) / n
    finally:
        engine.dispose()
        ctx.dbs.drop(url)
    return {"cpu_ms": round(cpu_ms, 3), "held_ms": round(1000 * held[0] / n, 3)}


def probe_rows(ctx: BenchContext) -> list[Row]:
    """Store CPU per item (idle probe) and the write lock held per item (loaded and idle), SQLite."""
    cfg = ctx.config
    items = max(30, cfg.items // 2)
    base = empty_transactions(ctx, "sqlite")
    floor_cpu, floor_held = 2 * base["cpu_ms"], 2 * base["held_ms"]
    ctx.note(
        settings={
            "probe items": items,
            "empty write transaction (SQLite)": f"CPU {base['cpu_ms']} ms, lock held {base['held_ms']} ms",
        }
    )
    rows: list[Row] = []
    figure_cpu = "store CPU per item (claim + finish + dispatch share + renew share), SQLite"
    idle = loaded = None
    try:
        if cfg.quick:  # one probe process (1 thread): alone, then beside a worker (saves start-ups)
            idle, loaded = run_probe(ctx, "sqlite", 1, (False, True), items)
        else:
            (idle,) = run_probe(ctx, "sqlite", 1, (False,), items)
    except BenchmarkError as exc:
        print(f"[benchmarks] {NAME} probe idle: {exc}", file=sys.stderr)
        rows.append(_missing(figure_cpu, f"<= {STORE_CPU_GOAL_MS} ms", exc))
        rows.append(_missing("SQLite write lock held per item, idle", f"<= {LOCK_GOAL_MS} ms", exc))
    if not cfg.quick:
        try:
            (loaded,) = run_probe(ctx, "sqlite", cfg.threads, (True,), items)
        except BenchmarkError as exc:
            print(f"[benchmarks] {NAME} probe loaded: {exc}", file=sys.stderr)
            rows.append(_missing("SQLite write lock held per item, loaded", f"<= {LOCK_GOAL_MS} ms", exc))

    def split(p: dict[str, Any]) -> str:
        return (
            f"claim {p['claim_ms']} + finish {p['finish_ms']} + dispatch {p['dispatch_ms']} + renew "
            f"{p['renew_ms']} ms ({p['beats']} beats); Redis client calls of the top-up "
            f"{p['redis_client_ms']} ms not counted; {p['items']} items"
        )

    def probe_load(p: dict[str, Any]) -> str:
        return load_text(*p["loadavg"], p["others_cores"])

    if idle is not None:
        rows.append(
            Row(
                NAME,
                "probe, 1 thread",
                figure_cpu,
                idle["store_cpu_ms"],
                "ms",
                goal=f"<= {STORE_CPU_GOAL_MS} ms",
                verdict=_verdict(idle["store_cpu_ms"] <= STORE_CPU_GOAL_MS),
                baseline=f"2 empty transactions {floor_cpu:.2f} ms",
                ratio=round(idle["store_cpu_ms"] / floor_cpu, 2) if floor_cpu else None,
                load=probe_load(idle),
                note=split(idle),
                detail=idle,
            )
        )
    for label, p in (("loaded", loaded), ("idle", idle)):
        if p is None:
            continue
        shape = f"probe, {p['probe_threads']} thread(s)" + (
            f" + a worker of {p['companion_threads']} threads" if p["companion_threads"] else ""
        )
        rows.append(
            Row(
                NAME,
                shape,
                f"SQLite write lock held per item, {label}",
                p["held_ms"],
                "ms",
                goal=f"<= {LOCK_GOAL_MS} ms",
                verdict=_verdict(p["held_ms"] <= LOCK_GOAL_MS),
                baseline=f"2 empty write transactions {floor_held:.2f} ms",
                ratio=round(p["held_ms"] / floor_held, 2) if floor_held else None,
                load=probe_load(p),
                note=f"of which the holding thread's CPU {p['held_cpu_ms']} ms (the rest: waiting "
                "for the GIL or a core); "
                f"{p['write_transactions_per_item']} write transactions per item; at most "
                f"{1000 / p['held_ms']:.0f} items/s for any number of workers"
                + (f"; store CPU per item here {p['store_cpu_ms']} ms ({split(p)})" if p is loaded else ""),
                detail=p,
            )
        )
    return rows


# -- analysis: photojobs worker vs Pool(P) -------------------------------------------------------
def analysis_rows(ctx: BenchContext, shared: dict[str, Any]) -> list[Row]:
    """Pool, ``photojobs worker`` on the analysis lane, pool again; the ratio and CPU rows (with
    ``--quick``: the pool and the run the no-op step made through its SQLite fleet)."""
    cfg = ctx.config
    n, photos, warm = analysis_inputs(ctx)
    fig_rate = f"analysis photos/s vs Pool({cfg.processes}), SQLite, {n} photos 1600x1200"
    fig_cpu = "worker CPU per photo vs the pool's"
    timeout = 120 + n
    try:
        if "analysis" in shared:
            m, runs = shared["analysis"], shared["pool_runs"]
        else:
            runs = [run_pool(ctx, photos, timeout)]  # before, and after
            m = run_photojobs(
                ctx,
                "sqlite",
                lane="analysis",
                folder=photos,
                warm_folder=warm,
                shape="product",
                label=" (photojobs worker)",
            )
            runs.append(run_pool(ctx, photos, timeout))
    except BenchmarkError as exc:
        print(f"[benchmarks] {NAME} analysis: {exc}", file=sys.stderr)
        rate_goal, cpu_goal = f">= {ANALYSIS_GOAL}x", f"<= {CPU_RATIO_GOAL}x"
        return [_missing(fig_rate, rate_goal, exc), _missing(fig_cpu, cpu_goal, exc)]
    if m.count != n:
        raise BenchmarkError(f"photojobs found {m.count} photos, the folder holds {n}")
    pool_rate, pool_cpu_ms, pool_others = pool_stats(runs)
    ratio = m.rate / pool_rate
    workers_ms = m.cpu_ms.get("workers", 0.0)
    fleet_ms = workers_ms + m.cpu_ms.get("supervisor + sweeper", 0.0)
    cpu_ratio = workers_ms / pool_cpu_ms
    pool_rates = ", ".join(f"{r['photos'] / r['seconds']:.1f}" for r in runs)
    pool_load = f"pool before/after: {pool_rates} photos/s, others {pool_others:.2f} cores"
    return [
        Row(
            NAME,
            "photojobs worker",
            fig_rate,
            round(m.rate, 1),
            "photos/s",
            goal=f">= {ANALYSIS_GOAL}x",
            verdict=_verdict(ratio >= ANALYSIS_GOAL),
            baseline=f"Pool({cfg.processes}) {pool_rate:.1f} photos/s",
            ratio=round(ratio, 3),
            load=measured_load(m),
            note=f"{pool_load}; steady {m.figures['steady_rate_p10_p90']}/s; "
            f"claimed -> succeeded {m.figures['claim_to_succeeded_ms_mean']} ms mean",
            detail={"photojobs": {"seconds": m.seconds, **m.figures, "cpu_ms": m.cpu_ms}, "pool_runs": runs},
        ),
        Row(
            NAME,
            "photojobs worker",
            fig_cpu,
            round(workers_ms, 2),
            "ms",
            goal=f"<= {CPU_RATIO_GOAL}x",
            verdict=_verdict(cpu_ratio <= CPU_RATIO_GOAL),
            baseline=f"Pool({cfg.processes}) {pool_cpu_ms:.2f} ms",
            ratio=round(cpu_ratio, 3),
            load=measured_load(m),
            note=f"the worker processes; with the supervisor + in-process sweeper {fleet_ms:.2f} ms; "
            f"Redis {m.cpu_ms.get('redis', 0.0):.2f} ms",
        ),
    ]


# -- recovery ------------------------------------------------------------------------------------
def recovery_goal(ctx: BenchContext) -> tuple[list[Row], list[Row]]:
    """:mod:`benchmarks.recovery` on the heavy stores; the goal row is the max over every run."""
    figure = "SIGKILL -> running again, max over runs"
    load0 = cpu.loadavg()
    busy0, self0, t0 = cpu.machine_busy(), cpu.self_cpu(), time.monotonic()
    try:
        rows = recovery_rows(ctx, ctx.config.heavy_stores)
    except BenchmarkError as exc:
        return [_missing(figure, f"<= {RECOVERY_GOAL_S:g} s", exc)], []
    runs = [r for r in rows if r.figure.startswith("kill -> second claim #") and r.value is not None]
    if not runs:
        return [_missing(figure, f"<= {RECOVERY_GOAL_S:g} s", BenchmarkError("no run"))], rows
    worst = max(float(r.value) for r in runs)  # type: ignore[arg-type]
    # The recovery runs idle most of the time (a 5 s sleep): the machine's busy time is the others'.
    others = max(0.0, cpu.machine_busy() - busy0 - (cpu.self_cpu() - self0)) / (time.monotonic() - t0)
    goal = Row(
        NAME,
        "recovery (2 workers x 1 thread)",
        figure,
        worst,
        "s",
        goal=f"<= TTL + 1 s = {RECOVERY_GOAL_S:g} s",
        verdict=_verdict(worst <= RECOVERY_GOAL_S),
        baseline=f"TTL {TTL:g} s + 1 s",
        ratio=round(worst / RECOVERY_GOAL_S, 3),
        load=f"load {load0:.1f}->{cpu.loadavg():.1f}, busy {others:.2f} cores (all processes)",
        note=f"{len(runs)} runs: " + ", ".join(f"{r.case} {r.value} s" for r in runs),
    )
    return [goal], rows


@register(NAME, "Issue 9's goals, each against a baseline measured in the same run")
def goals(ctx: BenchContext) -> list[Row]:
    """Every goal row first (no-op per store, store CPU, write lock loaded/idle, analysis, CPU per
    photo, recovery), then the rows they came from."""
    cfg = ctx.config
    ctx.note(
        settings={
            "processes": cfg.processes,
            "threads": cfg.threads,
            "items": cfg.items,
            "photos": SMALL_PHOTOS if cfg.quick else cfg.photos,
            "recovery stores": ",".join(cfg.heavy_stores),
            "repetitions": cfg.repetitions,
        }
    )
    goal_rows: list[Row] = []
    extra: list[Row] = []
    shared: dict[str, Any] = {}
    steps = (
        ("no-op", lambda: noop_rows(ctx, shared)[0]),
        ("probe", lambda: probe_rows(ctx)),
        ("analysis", lambda: analysis_rows(ctx, shared)),
    )
    for what, step in steps:
        print(f"[benchmarks] {NAME}: {what} ... ({time.strftime('%H:%M:%S')})", file=sys.stderr, flush=True)
        try:
            goal_rows += step()
        except Exception as exc:  # noqa: BLE001 - the other goal rows still run
            import traceback

            traceback.print_exc()
            goal_rows.append(_missing(what, "", exc))
    print(f"[benchmarks] {NAME}: recovery ...", file=sys.stderr, flush=True)
    try:
        got, extra = recovery_goal(ctx)
        goal_rows += got
    except Exception as exc:  # noqa: BLE001
        import traceback

        traceback.print_exc()
        goal_rows.append(_missing("SIGKILL -> running again, max over runs", "", exc))
    return goal_rows + extra
