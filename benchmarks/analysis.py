"""The analysis lane against a plain ``multiprocessing.Pool`` running the same analysis.

Same photos, same function (``photos.analyze.analyze``), same number of processes P (``--processes``,
2 by default, so the same cores):

- photos: ``photojobs.testing.samples.generate_samples(dest, --photos, seed=1, size=(1600, 1200))``, made once
  (analysis changes no file, so every run reads the same folder; a copy of the first few is the
  warm-up job);
- baseline: ``python -m benchmarks.analysis_pool P FOLDER``: ``Pool(P).map(analyze, paths)``, its
  wall time; run before the first photojobs run and after each, and each photojobs run is held
  against the pooled rate of the pool runs just before and after it (the machine may be shared);
- photojobs: ``Client(Settings.from_env(env)).submit(["analysis"], [folder])`` with P workers
  ``python -m dramatiq actors --processes 1 --threads T --queues photojobs.analysis`` (T = 1, then
  2) plus the sweeper; from the submission's commit to the last ``item_succeeded``
  (:func:`benchmarks.throughput.run_photojobs`, the noop benchmark's harness).

Goal: photojobs / pool >= 0.9. The CPU per photo of both is reported: the pool's over photojobs'
is the most the ratio can reach when the run is CPU-bound. Every store of ``--stores`` in full
runs; SQLite only with ``--quick``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .harness import BenchContext, BenchmarkError, StoreUnavailable, command_line
from .registry import Row, register
from .throughput import Measured, run_photojobs, summary_rows

NAME = "analysis"
GOAL_RATIO = 0.9
THREADS = (1, 2)
SIZE = (1600, 1200)
SEED = 1


def make_photos(
    ctx: BenchContext, n: int, prefix: str = "photos", seed: int = SEED, size: tuple[int, int] = SIZE
) -> Path:
    """``n`` sample photos in the work dir (made once per run, in ``<prefix>-<n>``)."""
    from photojobs.testing.samples import generate_samples

    dest = ctx.workdir / f"{prefix}-{n}"
    if not dest.exists():
        t0 = time.perf_counter()
        generate_samples(dest, n, seed=seed, size=size)
        ctx.note(settings={"generating the photos took (s)": round(time.perf_counter() - t0, 1)})
    return dest


def warm_copy(ctx: BenchContext, photos: Path, n: int) -> Path:
    """A folder with copies of the first ``n`` photos (the warm-up job; other paths, same bytes)."""
    dest = ctx.workdir / f"photos-warm-{n}"
    if not dest.exists():
        dest.mkdir()
        for src in sorted(photos.iterdir())[:n]:
            shutil.copy2(src, dest / src.name)
    return dest


def run_pool(ctx: BenchContext, folder: Path, timeout: float) -> dict[str, Any]:
    """The baseline in a child process (its own process group, killed on any exit)."""
    processes = ctx.config.processes
    cmd = [sys.executable, "-m", "benchmarks.analysis_pool", str(processes), str(folder)]
    ctx.note(command="pool: " + command_line(cmd))
    proc = ctx.procs.spawn("pool", cmd, {**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        proc.wait(timeout=timeout)
    except Exception as exc:
        raise BenchmarkError(f"the pool did not finish in {timeout:.0f}s") from exc
    finally:
        ctx.procs.kill(proc)
    log = ctx.procs.tail(proc, 20_000)
    lines = [line for line in log.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise BenchmarkError(f"the pool exited with {proc.returncode}: {log[-2000:]}")
    data: dict[str, Any] = json.loads(lines[-1])
    return data


def pool_stats(runs: list[dict[str, Any]]) -> tuple[float, float, float]:
    """Pooled photos/s, CPU ms per photo and cores used by other processes, over the pool's runs."""
    photos = sum(r["photos"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    cpu_ms = 1000 * sum(r["cpu_s"] for r in runs) / photos
    others = sum(max(0.0, r["machine_busy_s"] - r["cpu_s"]) for r in runs) / seconds
    return photos / seconds, cpu_ms, others


def _rate(run: dict[str, Any]) -> float:
    return float(run["photos"] / run["seconds"])


def _pool_rows(runs: list[dict[str, Any]], processes: int) -> list[Row]:
    rate, cpu_ms, others = pool_stats(runs)
    case = f"multiprocessing.Pool({processes})"
    rates = ", ".join(f"{_rate(r):.1f}" for r in runs)
    return [
        Row(
            NAME,
            case,
            "throughput",
            round(rate, 1),
            "photos/s",
            note=f"{len(runs)} runs, one before and one after each photojobs run: {rates} photos/s; "
            "the map() call's wall time",
            detail={"runs": runs},
        ),
        Row(
            NAME,
            case,
            "CPU per photo",
            round(cpu_ms, 2),
            "ms",
            note=f"the pool's processes; {cpu_ms * rate / 1000:.2f} cores busy "
            f"(other processes on the machine: {others:.2f} cores)",
        ),
    ]


def _ratio_row(m: Measured, around: list[dict[str, Any]]) -> Row:
    """photojobs against the pool runs just before and after it (so a change in load hits both)."""
    pool_rate, pool_cpu_ms, _ = pool_stats(around)
    ratio = m.rate / pool_rate
    steady = m.figures.get("steady_rate_p10_p90")
    own = {k: v for k, v in m.cpu_ms.items() if k != "other processes"}
    cpu_ms = sum(own.values())
    split = ", ".join(f"{k} {v:.2f}" for k, v in own.items() if v)
    return Row(
        NAME,
        m.case,
        "ratio photojobs / pool",
        round(ratio, 3),
        "x",
        goal=f">= {GOAL_RATIO}x",
        verdict="met" if ratio >= GOAL_RATIO else "missed",
        note=f"pool runs around it {', '.join(f'{_rate(r):.1f}' for r in around)} photos/s; "
        + (f"steady rate / pool {steady / pool_rate:.3f}x; " if steady else "")
        + f"CPU per photo {cpu_ms:.2f} ms ({split}) vs the pool's {pool_cpu_ms:.2f} ms: "
        f"{pool_cpu_ms / cpu_ms:.2f}x is the most a CPU-bound run can reach",
        detail={"pool_rate": round(pool_rate, 1), "pool_cpu_ms_per_photo": round(pool_cpu_ms, 3)},
    )


@register(NAME, "Analysis lane (photos/s) vs multiprocessing.Pool over the same photos (goal >= 0.9x)")
def analysis(ctx: BenchContext) -> list[Row]:
    """Pool; then per store and T: photojobs, pool again. Rows with rates, CPU and ratios."""
    cfg = ctx.config
    n = cfg.photos
    stores = cfg.heavy_stores
    warm_n = max(cfg.warmup_for(n, t) for t in THREADS)
    ctx.note(
        settings={
            "photos": f"{n} x {SIZE[0]}x{SIZE[1]} JPEG (generate_samples seed={SEED})",
            "processes": cfg.processes,
            "threads": "/".join(map(str, THREADS)),
            "warmup": warm_n,
            "stores": ",".join(stores),
        }
    )
    photos = make_photos(ctx, n)
    warm = warm_copy(ctx, photos, warm_n)
    timeout = 120 + n
    pool_runs = [run_pool(ctx, photos, timeout)]
    rows: list[Row] = []
    cases: list[tuple[Measured, list[dict[str, Any]]]] = []
    for store in stores:
        for threads in THREADS:
            try:
                m = run_photojobs(
                    ctx,
                    store,
                    lane="analysis",
                    folder=photos,
                    warm_folder=warm,
                    threads=threads,
                    label=f", T={threads}",
                )
            except StoreUnavailable as exc:
                case = f"photojobs {store}"
                rows.append(Row(NAME, case, "throughput", None, verdict="skipped", note=str(exc)))
                break
            except BenchmarkError as exc:
                print(f"[benchmarks] {NAME} photojobs {store} T={threads}: {exc}", file=sys.stderr)
                case = f"photojobs {store}, T={threads}"
                rows.append(Row(NAME, case, "throughput", None, verdict="error", note=str(exc)[:500]))
                continue
            if m.count != n:
                raise BenchmarkError(f"photojobs found {m.count} photos, the folder holds {n}")
            pool_runs.append(run_pool(ctx, photos, timeout))
            print(
                f"[benchmarks] {NAME} {m.case}: {m.rate:.1f} photos/s; pool before/after "
                f"{_rate(pool_runs[-2]):.1f}/{_rate(pool_runs[-1]):.1f} photos/s",
                file=sys.stderr,
                flush=True,
            )
            cases.append((m, pool_runs[-2:]))
    out = _pool_rows(pool_runs, cfg.processes)
    for m, around in cases:
        out += summary_rows(NAME, m, "photo")
        out.append(_ratio_row(m, around))
    return out + rows
