"""The bench harness's fleet against ``photojobs worker`` as users start it, back to back (issue 9).

Issue 9 saw the harness fleet (P ``dramatiq actors --processes 1`` commands + a separate ``photojobs
sweep``) measure 157 items/s and ``photojobs worker --processes 2 --threads 4`` 66-69 items/s, in
different runs. Here, in one run, on SQLite, the same N no-op items:

- harness: the old ``noop`` benchmark's fleet: ``PHOTOJOBS_FLEET_PROCESSES=P``,
  ``PHOTOJOBS_LANE_NOOP_THREADS=T`` (so the lane's bound is 2 x T x P), one queue;
- photojobs worker: the command as users type it: every lane's queue (two Dramatiq consumers per
  queue per process), the noop lane's declared threads (8, not ``--threads``) in its bound, the
  sweeper in the supervisor's process;
- photojobs worker --lanes noop: the same with the noop queue only (isolates the extra consumers).

Both get the same worker environment (``photojobs.cli_support.worker_env``: prefetch = threads,
``dramatiq_worker_timeout`` 250 ms), the same log level and the same Redis.
"""

from __future__ import annotations

import sys
import time

from . import cpu
from .harness import BenchContext, BenchmarkError, now_ms
from .registry import Row, register
from .throughput import Measured, run_photojobs

NAME = "shapes"
CASES = (
    ("harness fleet (dramatiq actors x P + photojobs sweep)", "harness", None),
    ("photojobs worker (every lane)", "product", None),
    ("photojobs worker --lanes noop", "product", "noop"),
)


IDLE_SECONDS = 10.0


def idle_cpu(ctx: BenchContext, shape: str, lanes: str | None) -> float:
    """CPU (in % of one core) a fleet of this shape uses with nothing to do (Redis polling, heartbeats,
    sweeps), over ``IDLE_SECONDS`` after it is ready."""
    cfg = ctx.config
    url = ctx.dbs.create("sqlite", "idle")
    procs = []
    try:
        env = ctx.photojobs_env(url, PHOTOJOBS_RUNTIME_DIR=str(ctx.workdir / "runtime"))
        since = now_ms()
        if shape == "product":
            procs.append(ctx.start_product(env, ctx.product_command(cfg.processes, cfg.threads, lanes)))
        else:
            env.update(
                PHOTOJOBS_FLEET_PROCESSES=str(cfg.processes), PHOTOJOBS_LANE_NOOP_THREADS=str(cfg.threads)
            )
            procs += [ctx.start_worker(env, cfg.threads) for _ in range(cfg.processes)]
            procs.append(ctx.start_sweeper(env))
        ctx.wait_workers_ready(procs[:1] if shape == "product" else procs[:-1], since, cfg.processes)
        time.sleep(2.0)  # let start-up work settle (imports, first sweep)
        pids = {"fleet": [pid for p in procs for pid in cpu.tree(p.pid)]}
        before, t0 = cpu.snapshot({}, {}, pids), time.monotonic()
        time.sleep(IDLE_SECONDS)
        used = sum(cpu.snapshot({}, {}, pids).values()) - sum(before.values())
        return 100 * used / (time.monotonic() - t0)
    finally:
        for p in procs:
            ctx.procs.kill(p)
        ctx.dbs.drop(url)


def _own_cpu(m: Measured) -> float:
    return sum(v for k, v in m.cpu_ms.items() if k not in ("other processes", "benchmark (poll)"))


@register(NAME, "Harness fleet vs `photojobs worker` (every lane / --lanes noop), no-op, SQLite, one run")
def shapes(ctx: BenchContext) -> list[Row]:
    """Each shape once, back to back; its rate, CPU per item (split) and ratio to the harness."""
    cfg = ctx.config
    ctx.note(
        settings={"processes": cfg.processes, "threads": cfg.threads, "items": cfg.items, "store": "sqlite"}
    )
    rows: list[Row] = []
    base: Measured | None = None
    for case, shape, lanes in CASES:
        try:
            m = run_photojobs(ctx, "sqlite", shape=shape, lanes_arg=lanes, label=f" [{case}]")
        except BenchmarkError as exc:
            print(f"[benchmarks] {NAME} {case}: {exc}", file=sys.stderr)
            rows.append(Row(NAME, case, "throughput", None, verdict="error", note=str(exc)[:500]))
            continue
        base = base or m
        l0, l1 = m.figures["loadavg"]
        others = m.cpu_ms.get("other processes", 0.0) * m.count / 1000 / m.seconds
        split = ", ".join(
            f"{k} {v:.2f}"
            for k, v in m.cpu_ms.items()
            if v and k not in ("other processes", "benchmark (poll)")
        )
        rows.append(
            Row(
                NAME,
                case,
                "no-op throughput",
                round(m.rate, 1),
                "items/s",
                baseline=f"harness {base.rate:.1f} items/s",
                ratio=round(m.rate / base.rate, 3),
                load=f"load {l0:.1f}->{l1:.1f}, others {others:.2f} cores",
                note=f"steady {m.figures['steady_rate_p10_p90']}/s; bound {m.figures['bound']}; "
                f"wait in Redis "
                f"{m.figures['wait_in_redis_ms_mean']} ms; claimed -> succeeded "
                f"{m.figures['claim_to_succeeded_ms_mean']} ms",
                detail={"seconds": m.seconds, **m.figures, "cpu_ms": m.cpu_ms},
            )
        )
        rows.append(
            Row(
                NAME,
                case,
                "CPU per item (the fleet + Redis)",
                round(_own_cpu(m), 2),
                "ms",
                baseline=f"harness {_own_cpu(base):.2f} ms",
                ratio=round(_own_cpu(m) / _own_cpu(base), 3),
                note=split,
            )
        )
    for case, shape, lanes in CASES:
        try:
            pct = idle_cpu(ctx, shape, lanes)
        except BenchmarkError as exc:
            rows.append(Row(NAME, case, "idle CPU", None, verdict="error", note=str(exc)[:500]))
            continue
        rows.append(
            Row(
                NAME,
                case,
                "idle CPU of the fleet (no job)",
                round(pct, 1),
                "% of a core",
                note=f"over {IDLE_SECONDS:g} s once ready: Redis polling by the consumers (2 per queue per "
                "process, dramatiq_worker_timeout), heartbeats, sweeps",
            )
        )
    return rows
