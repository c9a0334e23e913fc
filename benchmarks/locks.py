"""The cost of photo locks and of the dispatcher, against the plain no-op figure.

The ``noop`` lane run exactly as the ``noop`` benchmark runs it (:func:`benchmarks.throughput.run_photojobs`:
same P worker processes x T threads, same N items, same private Redis, one sweeper, a fresh database
per run), three ways per store, the lane's spec changed only through the environment of every
process of the run (workers, sweeper and the submitting client):

- (a) as shipped: no photo lock, the default bound (2 x T x P messages in Redis, or ``--bound``);
- (b) ``PHOTOJOBS_LANE_NOOP_LOCK=X``: every claim takes an exclusive lock on the item's photo (the
  photo's row lock, a look for conflicting locks, a ``photo_locks`` row) and its finish drops it.
  Every item has a photo of its own, so nothing is ever deferred: this is the lock's bare cost;
- (c) ``PHOTOJOBS_LANE_NOOP_BOUND=4``: at most 4 messages in Redis for 2 x T threads, so the workers
  run the dispatcher (``take_for_dispatch``, a write transaction) after about every other item and
  threads wait for work between top-ups: the dispatcher's cost.

Reported: items/s of each (from the submission's commit to the last success) and the ratios
(b)/(a) and (c)/(a), with the CPU per item of each so the difference can be attributed. The machine
may be shared: full runs go a, b, c then c, b, a and report the pooled rate of both rounds (a
drift in the background load then weighs on every variant alike); ``--quick`` runs each once on
100 items, SQLite only.
"""

from __future__ import annotations

import statistics
import sys

from .harness import BenchContext, BenchmarkError, StoreUnavailable
from .registry import Row, register
from .throughput import Measured, run_photojobs, summary_rows

NAME = "locks"
SMALL_BOUND = 4
QUICK_ITEMS = 100
FULL_ROUNDS = 2

#: key -> (label, environment of the run)
VARIANTS: dict[str, tuple[str, dict[str, str]]] = {
    "a": ("no lock", {}),
    "b": ("exclusive lock", {"PHOTOJOBS_LANE_NOOP_LOCK": "X"}),
    "c": (f"bound {SMALL_BOUND}", {"PHOTOJOBS_LANE_NOOP_BOUND": str(SMALL_BOUND)}),
}


def pooled(runs: list[Measured]) -> Measured:
    """The rounds of one variant as one measurement: all items over all seconds, mean figures."""
    first = runs[0]
    if len(runs) == 1:
        return first
    figures: dict[str, object] = {}
    for key, value in first.figures.items():
        values = [r.figures.get(key) for r in runs]
        if isinstance(value, int | float) and not isinstance(value, bool) and None not in values:
            mean = statistics.fmean(float(v) for v in values)  # type: ignore[arg-type]
            figures[key] = round(mean, 3) if isinstance(value, float) else round(mean)
        else:
            figures[key] = value
    labels = {k for r in runs for k in r.cpu_ms}
    cpu_ms = {k: round(statistics.fmean(r.cpu_ms.get(k, 0.0) for r in runs), 3) for k in labels}
    return Measured(
        case=first.case,
        count=sum(r.count for r in runs),
        seconds=sum(r.seconds for r in runs),
        figures=figures,
        cpu_ms=cpu_ms,
    )


def _own_cpu(m: Measured) -> dict[str, float]:
    return {k: v for k, v in m.cpu_ms.items() if k != "other processes"}


def _ratio_row(store: str, key: str, a: Measured, x: Measured, rounds: list[float]) -> Row:
    ca, cx = _own_cpu(a), _own_cpu(x)
    diff = {k: cx.get(k, 0.0) - ca.get(k, 0.0) for k in {*ca, *cx}}
    big = sorted(((k, d) for k, d in diff.items() if abs(d) >= 0.05), key=lambda kd: -abs(kd[1]))
    parts = ", ".join(f"{k} {d:+.2f}" for k, d in big) or "no change above 0.05 ms"
    fa, fx = a.figures, x.figures
    run_a, run_x = fa.get("claim_to_succeeded_ms_mean"), fx.get("claim_to_succeeded_ms_mean")
    wait_a, wait_x = fa.get("wait_in_redis_ms_mean"), fx.get("wait_in_redis_ms_mean")
    label = VARIANTS[key][0]
    per_round = f"per round {', '.join(f'{r:.3f}' for r in rounds)}; " if len(rounds) > 1 else ""
    return Row(
        NAME,
        f"{store}: ({key}) / (a)",
        f"ratio {label} / no lock",
        round(x.rate / a.rate, 3),
        "x",
        note=f"{per_round}CPU per item {sum(cx.values()) - sum(ca.values()):+.2f} ms ({parts}); "
        f"claimed -> succeeded {run_a} -> {run_x} ms; wait in Redis {wait_a} -> {wait_x} ms",
        detail={"cpu_ms_per_item_difference": {k: round(d, 3) for k, d in diff.items()}},
    )


def _store(ctx: BenchContext, store: str, n: int, rounds: int) -> list[Row]:
    cfg = ctx.config
    folder = ctx.folder("noop", n)
    warm = ctx.folder("warm", cfg.warmup_for(n))
    runs: dict[str, list[Measured]] = {k: [] for k in VARIANTS}
    for r in range(rounds):
        for key in VARIANTS if r % 2 == 0 else reversed(VARIANTS):
            label, extra = VARIANTS[key]
            m = run_photojobs(
                ctx,
                store,
                folder=folder,
                warm_folder=warm,
                extra=extra,
                label=f", ({key}) {label}",
                note_commands=r == 0,  # the second round runs the same commands (on a fresh database)
            )
            print(
                f"[benchmarks] {NAME} {store} ({key}) {label} round {r + 1}: {m.rate:.1f} items/s",
                file=sys.stderr,
                flush=True,
            )
            runs[key].append(m)
    merged = {k: pooled(v) for k, v in runs.items()}
    rows: list[Row] = []
    for key, m in merged.items():
        got = summary_rows(NAME, m, "item")
        if rounds > 1:
            rates = ", ".join(f"{x.rate:.1f}" for x in runs[key])
            got[0].note = f"rounds {rates} items/s; " + got[0].note
            got[0].detail["rounds_items_per_s"] = [round(x.rate, 1) for x in runs[key]]
        rows += got
    for k in ("b", "c"):
        per_round = [x.rate / a.rate for x, a in zip(runs[k], runs["a"], strict=True)]
        rows.append(_ratio_row(store, k, merged["a"], merged[k], per_round))
    return rows


@register(NAME, "Photo-lock and dispatcher cost: noop lane as is, with an X lock, with bound 4")
def locks(ctx: BenchContext) -> list[Row]:
    """Per store: the noop lane (a) as is, (b) with an exclusive photo lock, (c) with a small bound."""
    cfg = ctx.config
    n = min(cfg.items, QUICK_ITEMS) if cfg.quick else cfg.items
    rounds = 1 if cfg.quick else FULL_ROUNDS
    ctx.note(
        settings={
            "processes": cfg.processes,
            "threads": cfg.threads,
            "items": n,
            "warmup": cfg.warmup_for(n),
            "rounds": f"{rounds} (a b c" + (", c b a)" if rounds > 1 else ")"),
            "(a) bound": cfg.bound or f"runtime default 2*T*P = {2 * cfg.threads * cfg.processes}",
            "(b)": "PHOTOJOBS_LANE_NOOP_LOCK=X",
            "(c)": f"PHOTOJOBS_LANE_NOOP_BOUND={SMALL_BOUND}",
            "stores": ",".join(cfg.heavy_stores),
        }
    )
    rows: list[Row] = []
    for store in cfg.heavy_stores:
        try:
            rows += _store(ctx, store, n, rounds)
        except StoreUnavailable as exc:
            rows.append(Row(NAME, store, "throughput", None, verdict="skipped", note=str(exc)))
        except BenchmarkError as exc:
            print(f"[benchmarks] {NAME} {store}: {exc}", file=sys.stderr)
            rows.append(Row(NAME, store, "throughput", None, verdict="error", note=str(exc)[:500]))
    return rows
