"""Sweep pass and dispatch against the size of the table: 10k / 100k / 1M pending items.

For each store and size a fresh database gets N pending ``noop`` items over 4 jobs, behind N/10
succeeded items of an older job (``photojobs.testing.scale.seed_pending``: set-based inserts, seconds
for 1M).
Then, in this process against the run's private Redis:

- **dispatch**: ``take_for_dispatch(noop, bound=16)`` — what every finished item's top-up and every
  sweep pass run; the lane is reset to all-pending between calls (not timed);
- **sweep pass**: a sweeper pass (``photojobs.maintenance``) over every lane (revoke expired leases,
  re-publish lost messages, dispatch each lane, number events), Redis flushed and the lane reset
  between passes;
Every size is built first and the sizes are then timed in alternation, so load from other
processes falls on all of them alike.

- **plans**: ``EXPLAIN`` of the hot-path statements (``photojobs.testing.scale.hot_paths``); any node
  reading the whole ``items`` table is reported.

Goal: flat within 2x — the median at the largest size at most twice the median at the smallest.
``PJBENCH_SCALE_SIZES`` (e.g. ``10000,100000``) overrides the sizes; ``--quick`` uses 1k/10k/100k.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from .harness import BenchContext, StoreUnavailable
from .registry import Row, register

NAME = "scale"
FULL_SIZES = (10_000, 100_000, 1_000_000)
QUICK_SIZES = (1_000, 10_000, 100_000)
DISPATCH_REPS = 21
SWEEP_REPS = 11
LEGACY_REPS = 3
BOUND = 16


def _sizes(ctx: BenchContext) -> tuple[int, ...]:
    raw = os.environ.get("PJBENCH_SCALE_SIZES")
    if raw:
        return tuple(int(x) for x in raw.split(",") if x.strip())
    return QUICK_SIZES if ctx.config.quick else FULL_SIZES


class _Table:
    """One store at one size: a fresh database with N pending items, an engine, a publisher."""

    def __init__(self, ctx: BenchContext, store: str, n: int) -> None:
        from photojobs.broker import RedisPublisher, build_broker
        from photojobs.testing import scale
        from store.engine import make_engine
        from store.lanes import all_lanes

        self.ctx, self.n = ctx, n
        self.url = ctx.dbs.create(store, "scale")
        self.engine = make_engine(self.url)
        self.broker = build_broker(ctx.redis.url)
        self.specs = all_lanes({})
        t0 = time.perf_counter()
        self.jobs = scale.seed_pending(self.engine, n, jobs=4, finished=n // 10)
        self.seed_s = time.perf_counter() - t0
        self.publisher = RedisPublisher(self.broker, self.specs)
        self.times: dict[str, list[float]] = {"dispatch": [], "sweep": [], "legacy": []}
        self.maintenance: Any = None  # photojobs.maintenance.Maintenance, made at the first sweep

    def reset(self) -> None:
        from photojobs.testing import scale

        scale.requeue(self.engine)
        self.ctx.redis.flush()

    def timed(self, what: str, fn: Callable[[], Any]) -> None:
        self.reset()
        t0 = time.perf_counter()
        fn()
        self.times[what].append(1000 * (time.perf_counter() - t0))

    def dispatch(self) -> None:
        from store.dispatch import take_for_dispatch

        self.timed("dispatch", lambda: take_for_dispatch(self.engine, self.specs["noop"], bound=BOUND))

    def sweep(self) -> None:
        from photojobs.maintenance import Maintenance, default_services

        if self.maintenance is None:  # one set of services per table, as a sweeper keeps them
            services = default_services(self.engine, self.specs, self.publisher, republish_after=5.0)
            self.maintenance = Maintenance(services)
        self.timed("sweep", self.maintenance.run_pass)

    def legacy(self) -> None:
        from photojobs.testing import scale

        self.timed("legacy", lambda: scale.run_statement(self.engine, scale.legacy_dispatch_scan()))

    def result(self) -> dict[str, Any]:
        from photojobs.testing import scale

        plans = scale.hot_path_plans(self.engine, job_id=self.jobs[0])
        scans = {name: scale.full_scans(lines) for name, lines in plans.items()}
        return {
            "seed_s": round(self.seed_s, 2),
            "dispatch_ms": statistics.median(self.times["dispatch"]),
            "sweep_ms": statistics.median(self.times["sweep"]),
            "legacy_ms": statistics.median(self.times["legacy"]),
            "dispatch_all_ms": [round(x, 2) for x in self.times["dispatch"]],
            "sweep_all_ms": [round(x, 2) for x in self.times["sweep"]],
            "plans": plans,
            "full_scans": {k: v for k, v in scans.items() if v},
        }

    def close(self) -> None:
        self.broker.close()
        self.engine.dispose()
        self.ctx.dbs.drop(self.url)


def _measure_store(ctx: BenchContext, store: str, sizes: tuple[int, ...]) -> dict[int, dict[str, Any]]:
    """Build every size first, then time them in alternation (round after round), so that a burst of
    load on this shared machine falls on every size alike rather than on one."""
    tables: list[_Table] = []
    try:
        for n in sizes:
            print(f"[benchmarks] scale: building {store}, {_label(n)} pending ...", flush=True)
            tables.append(_Table(ctx, store, n))
        for t in tables:
            t.dispatch()  # warm-up (connections, caches), not kept
            t.times["dispatch"].clear()
        for rep in range(max(DISPATCH_REPS, SWEEP_REPS)):
            for t in tables:
                if rep < DISPATCH_REPS:
                    t.dispatch()
                if rep < SWEEP_REPS:
                    t.sweep()
                if rep < LEGACY_REPS:
                    t.legacy()
        return {t.n: t.result() for t in tables}
    finally:
        for t in tables:
            t.close()


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n >= 1_000_000 and n % 1_000_000 == 0 else f"{n // 1000}k"


@register(NAME, "Sweep pass and dispatch at 10k / 100k / 1M pending items (flat within 2x)")
def scale_bench(ctx: BenchContext) -> list[Row]:
    """Median dispatch and sweep-pass times per store and table size, and the flatness verdicts."""
    sizes = _sizes(ctx)
    ctx.note(
        settings={
            "pending items": ", ".join(_label(n) for n in sizes),
            "jobs": "4 with pending items + 1 finished (N/10 succeeded items)",
            "dispatch": f"take_for_dispatch(noop, bound={BOUND}), median of {DISPATCH_REPS}",
            "sweep pass": f"a sweeper pass over all lanes, median of {SWEEP_REPS}",
        }
    )
    rows: list[Row] = []
    for store in ctx.config.stores:
        try:
            results = _measure_store(ctx, store, sizes)
        except StoreUnavailable as exc:
            rows.append(Row(NAME, store, "sweep pass and dispatch", None, verdict="skipped", note=str(exc)))
            continue
        for n, r in results.items():
            case = f"{store}, {_label(n)} pending"
            scans = r["full_scans"]
            rows += [
                Row(
                    NAME,
                    case,
                    "dispatch (take_for_dispatch, 16 items)",
                    round(r["dispatch_ms"], 2),
                    "ms",
                    note=f"table built in {r['seed_s']:.1f} s",
                    detail={"all_ms": r["dispatch_all_ms"]},
                ),
                Row(
                    NAME,
                    case,
                    "sweep pass (all lanes)",
                    round(r["sweep_ms"], 2),
                    "ms",
                    detail={"all_ms": r["sweep_all_ms"]},
                ),
                Row(
                    NAME,
                    case,
                    "for comparison: the old dispatcher's DISTINCT job_id over pending items",
                    round(r["legacy_ms"], 2),
                    "ms",
                    note="one statement of the dispatch transaction before this change",
                ),
                Row(
                    NAME,
                    case,
                    "hot-path plans reading all of items",
                    len(scans),
                    "",
                    goal="0",
                    verdict="met" if not scans else "missed",
                    note="; ".join(f"{k}: {v[0]}" for k, v in scans.items())
                    or "every hot-path statement is an index search",
                    detail={"plans": r["plans"]},
                ),
            ]
        small, large = min(results), max(results)
        for key, figure in (("dispatch_ms", "dispatch"), ("sweep_ms", "sweep pass")):
            ratio = results[large][key] / max(results[small][key], 1e-6)
            rows.append(
                Row(
                    NAME,
                    f"{store}, {_label(large)} vs {_label(small)}",
                    f"{figure}: time ratio",
                    round(ratio, 2),
                    "x",
                    goal="flat within 2x (<= 2)",
                    verdict="met" if ratio <= 2.0 else "missed",
                    note=f"{results[small][key]:.2f} ms -> {results[large][key]:.2f} ms",
                )
            )
    return rows
