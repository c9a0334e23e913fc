"""Sweep pass and dispatch against the size of the table: 10k / 100k / 1M pending items.

For each store and size a fresh database gets N pending ``noop`` items over 4 jobs, behind N/10
succeeded items of an older job (``store.scale.seed_pending``: set-based inserts, seconds for 1M).
Then, in this process against the run's private Redis:

- **dispatch**: ``take_for_dispatch(noop, bound=16)`` — what every finished item's top-up and every
  sweep pass run; the lane is reset to all-pending between calls (not timed);
- **sweep pass**: ``sweep_once`` over every lane (revoke expired leases, re-publish lost messages,
  dispatch each lane, number events), Redis flushed and the lane reset between passes;
- **plans**: ``EXPLAIN`` of the hot-path statements (``store.scale.hot_paths``); any node reading the
  whole ``items`` table is reported.

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
DISPATCH_REPS = 15
SWEEP_REPS = 9
BOUND = 16


def _sizes(ctx: BenchContext) -> tuple[int, ...]:
    raw = os.environ.get("PJBENCH_SCALE_SIZES")
    if raw:
        return tuple(int(x) for x in raw.split(",") if x.strip())
    return QUICK_SIZES if ctx.config.quick else FULL_SIZES


def _median_ms(fn: Callable[[], Any], reset: Callable[[], Any], reps: int) -> tuple[float, list[float]]:
    times = []
    for _ in range(reps):
        reset()
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return statistics.median(times), times


def _measure(ctx: BenchContext, store: str, n: int) -> dict[str, Any]:
    from photojobs.broker import RedisPublisher, build_broker
    from photojobs.lanes import all_lanes
    from store import scale
    from store.dispatch import take_for_dispatch
    from store.engine import make_engine
    from store.sweeper import sweep_once

    url = ctx.dbs.create(store, "scale")
    engine = make_engine(url)
    broker = build_broker(ctx.redis.url)
    try:
        specs = all_lanes({})
        spec = specs["noop"]
        t0 = time.perf_counter()
        jobs = scale.seed_pending(engine, n, jobs=4, finished=n // 10)
        seeded = time.perf_counter() - t0
        publisher = RedisPublisher(broker, specs)

        def reset() -> None:
            scale.requeue(engine)
            ctx.redis.flush()

        # Warm the connection pool and caches once, untimed.
        take_for_dispatch(engine, spec, bound=BOUND)
        dispatch, d_all = _median_ms(
            lambda: take_for_dispatch(engine, spec, bound=BOUND), reset, DISPATCH_REPS
        )
        sweep, s_all = _median_ms(
            lambda: sweep_once(engine, specs, publisher, republish_after=5.0), reset, SWEEP_REPS
        )
        legacy, _ = _median_ms(lambda: scale.run_statement(engine, scale.legacy_dispatch_scan()), reset, 3)
        plans = scale.hot_path_plans(engine, job_id=jobs[0])
        scans = {name: scale.full_scans(lines) for name, lines in plans.items()}
        return {
            "seed_s": round(seeded, 2),
            "dispatch_ms": dispatch,
            "sweep_ms": sweep,
            "legacy_ms": legacy,
            "dispatch_all_ms": [round(x, 2) for x in d_all],
            "sweep_all_ms": [round(x, 2) for x in s_all],
            "plans": plans,
            "full_scans": {k: v for k, v in scans.items() if v},
        }
    finally:
        broker.close()
        engine.dispose()
        ctx.dbs.drop(url)


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
            "sweep pass": f"sweep_once over all lanes, median of {SWEEP_REPS}",
        }
    )
    rows: list[Row] = []
    for store in ctx.config.stores:
        results: dict[int, dict[str, Any]] = {}
        try:
            for n in sizes:
                print(f"[benchmarks] scale: {store}, {_label(n)} pending ...", flush=True)
                results[n] = _measure(ctx, store, n)
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
