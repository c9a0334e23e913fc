"""The exif lane against exiftool alone, A-B-A in one run (issue 40).

``python -m benchmarks.exif_lane [--photos 400] [--size 1600x1200] [--store sqlite]`` makes
``--photos`` sample JPEGs and, on fresh copies of them each time:

A. **exiftool alone**: the same edit (a keyword added, a rating) in place, in two exiftool
   processes (the photos split in two halves), ``-overwrite_original -P``: photos/s (wall) and
   the two processes' CPU per photo;
B. **the exif lane**: one job of those photos through ``photojobs worker --processes 2 --threads 2
   --lanes exif`` (the product's shape; verification included), measured from the submission's
   commit to the job's last item (after a warm-up job through the same fleet): photos/s and the
   fleet's CPU per photo (exiftool included);
A. exiftool alone again.

It prints each run, the load, and the ratio of the lane's pace to the mean of the two exiftool
runs (the issue's goal: >= 0.25x). ``--profile`` runs one photo's ``edit_photo`` steps in this
process instead and prints where its time goes (decode, exiftool, hashing, fsync, history);
``--profile-lane`` runs the whole item (the store's transactions, the history, every fsync) over
25 photos in this process under cProfile.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.registry import Row, register

HERE = Path(__file__).resolve().parent.parent
EDIT = {"exif.keywords": "Bench", "exif.rating": "4"}


def _exiftool_alone(folder: Path) -> dict[str, Any]:
    from photos.exiftool import executable

    exe = executable()
    if exe is None:
        raise SystemExit("exiftool is not installed (make venv)")
    files = sorted(str(p) for p in folder.iterdir() if p.suffix.lower() == ".jpg")
    halves = [files[0::2], files[1::2]]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    procs = [
        subprocess.Popen(
            [exe, "-q", "-overwrite_original", "-P", "-XMP-dc:Subject+=Bench", "-XMP-xmp:Rating=4", *half],
            stdout=subprocess.DEVNULL,
        )
        for half in halves
    ]
    for proc in procs:
        if proc.wait() != 0:
            raise SystemExit("exiftool failed")
    seconds = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"rate": len(files) / seconds, "cpu_ms": 1000 * cpu / len(files), "seconds": seconds}


def _lane(ctx: Any, folder: Path, warm: Path, store: str) -> dict[str, Any]:
    from benchmarks.throughput import run_photojobs

    m = run_photojobs(
        ctx, store, lane="exif", folder=folder, warm_folder=warm, params=EDIT, threads=2,
        note_commands=False, shape="product", lanes_arg="exif",
    )  # fmt: skip
    cpu = m.cpu_ms.get("workers") or sum(m.cpu_ms.values())
    return {"rate": m.rate, "cpu_ms": cpu, "seconds": m.seconds, "count": m.count}


def _copy(src: Path, dst: Path) -> Path:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def run(photos: int, size: tuple[int, int], store: str) -> dict[str, Any]:
    from benchmarks.harness import BenchContext, Config

    ctx = BenchContext(Config(photos=photos, processes=2, threads=2))
    try:
        ctx.open()
        return measure(ctx, photos, size, store)
    finally:
        ctx.close()


def measure(ctx: Any, photos: int, size: tuple[int, int], store: str) -> dict[str, Any]:
    """The A-B-A run in an open :class:`benchmarks.harness.BenchContext`; its figures."""
    from benchmarks import cpu
    from photojobs.testing.samples import generate_samples

    out: dict[str, Any] = {"photos": photos, "size": f"{size[0]}x{size[1]}", "runs": []}
    ctx.current = "exif_lane"
    master = ctx.workdir / "exif-master"
    generate_samples(master, photos, seed=40, size=size)
    warm_master = ctx.workdir / "exif-warm-master"
    generate_samples(warm_master, 20, seed=41, size=size)
    for i, kind in enumerate(("exiftool", "lane", "exiftool")):
        folder = _copy(master, ctx.workdir / f"exif-run{i}")
        load0 = cpu.loadavg()
        if kind == "exiftool":
            figures = _exiftool_alone(folder)
        else:
            figures = _lane(ctx, folder, _copy(warm_master, ctx.workdir / f"exif-warm{i}"), store)
        figures.update(kind=kind, load=f"{load0:.1f} -> {cpu.loadavg():.1f}")
        out["runs"].append(figures)
        print(
            f"{kind:9s} {figures['rate']:7.1f} photos/s  {figures['cpu_ms']:7.1f} ms CPU/photo  "
            f"load {figures['load']}",
            flush=True,
        )
    tool = [r for r in out["runs"] if r["kind"] == "exiftool"]
    lane = next(r for r in out["runs"] if r["kind"] == "lane")
    base = sum(r["rate"] for r in tool) / len(tool)
    base_cpu = sum(r["cpu_ms"] for r in tool) / len(tool)
    out["ratio"] = lane["rate"] / base
    out["cpu_ratio"] = lane["cpu_ms"] / base_cpu
    print(f"ratio: the lane at {out['ratio']:.2f}x exiftool's pace (goal >= 0.25x); "
          f"CPU per photo {out['cpu_ratio']:.1f}x exiftool's")  # fmt: skip
    return out


@register("exif", "the exif lane (verification included) against exiftool alone, A-B-A (issue 40)")
def exif_lane_bench(ctx: Any) -> list[Row]:
    """``make bench``'s rows: the lane's pace and CPU per photo against exiftool alone's."""
    photos = int(os.environ.get("PJBENCH_EXIF_PHOTOS", 60 if ctx.config.quick else 400))
    out = measure(ctx, photos, (1600, 1200), "sqlite")
    lane = next(r for r in out["runs"] if r["kind"] == "lane")
    tool = [r for r in out["runs"] if r["kind"] == "exiftool"]
    base = sum(r["rate"] for r in tool) / len(tool)
    load = ", ".join(r["load"] for r in out["runs"])
    return [
        Row(
            "exif", f"{photos} x 1600x1200 JPEG, keyword + rating, sqlite", "lane pace vs exiftool alone",
            round(out["ratio"], 3), "x", goal=">= 0.25x", verdict="met" if out["ratio"] >= 0.25 else "missed",
            baseline=f"{base:.1f} photos/s", ratio=out["ratio"], load=load, detail=out,
        ),
        Row(
            "exif", f"{photos} x 1600x1200 JPEG", "lane CPU per photo vs exiftool alone's",
            round(out["cpu_ratio"], 2), "x", baseline=f"{lane['cpu_ms']:.1f} ms CPU/photo (lane)", load=load,
        ),
    ]  # fmt: skip


def profile(size: tuple[int, int], n: int = 20) -> None:
    """Where one photo's exif edit spends its time, step by step, in this process (no store)."""
    import hashlib
    import tempfile

    from photojobs.testing.samples import generate_samples
    from photos import exif, exiftool, formats, verify
    from photos.exif import ExifEdit, write_metadata
    from photos.fileops import staged_path

    steps: dict[str, float] = {}

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                steps[name] = steps.get(name, 0.0) + time.perf_counter() - t

        return wrapper

    exif.check_decodes = timed("decode the original (Pillow)", formats.check_decodes)
    exif.verify_written = timed("verify the written copy", verify.verify_written)
    tool = exiftool.ExifTool.shared()
    tool._execute = timed("exiftool commands", tool._execute)  # type: ignore[method-assign]
    exif._settle_copy = timed("fsync and times", exif._settle_copy)
    edit = ExifEdit(keywords=["Bench"], rating=4)
    with tempfile.TemporaryDirectory() as tmp:
        photos = generate_samples(Path(tmp), n, seed=40, size=size)
        write_metadata(photos[0], staged_path(photos[0], "warm"), edit)
        steps.clear()
        t0 = time.perf_counter()
        for p in photos:
            dst = staged_path(p, "p")
            write_metadata(p, dst, edit)
            t = time.perf_counter()
            hashlib.sha256(dst.read_bytes()).hexdigest()
            hashlib.sha256(p.read_bytes()).hexdigest()
            key = "hashing (base and result)"
            steps[key] = steps.get(key, 0.0) + time.perf_counter() - t
        total = time.perf_counter() - t0
    print(f"one photo's exif edit ({size[0]}x{size[1]}), mean of {n}: {1000 * total / n:.1f} ms")
    for name, seconds in sorted(steps.items(), key=lambda kv: -kv[1]):
        print(f"  {name:32s} {1000 * seconds / n:7.1f} ms")


#: What ``--profile-lane`` reports, as (label, module file suffix, function name) of cProfile's entries.
_LANE_STEPS = (
    ("the whole item (edit_photo)", "actors/exif.py", "edit_photo"),
    ("write_metadata (exiftool write, checks)", "photos/exif.py", "write_metadata"),
    ("  the original decodes (Pillow)", "photos/formats.py", "check_decodes"),
    ("  exiftool: the state read", "photos/exif.py", "_current_tags"),
    ("  exiftool: the write", "photos/exif.py", "_exiftool_write"),
    ("  verify before replace", "photos/verify.py", "verify_written"),
    ("record the intent (history included)", "actors/effects.py", "record_unit"),
    ("  history: keep the original", "photos/history.py", "keep"),
    ("  history: exiftool's tag comparison", "photos/history.py", "tag_changes"),
    ("apply and settle", "actors/effects.py", "apply_and_mark"),
    ("store statements (SQLAlchemy)", "sqlalchemy/orm/session.py", "execute"),
    ("fsync (every one)", "~", "<built-in method posix.fsync>"),
)


def profile_lane(size: tuple[int, int], n: int = 25) -> None:
    """The lane's own code (``tests.inline_lanes``: claimed, run, finished through a real SQLite
    store, no Dramatiq) over ``n`` photos in this process under cProfile: per photo, this
    process's CPU, the exiftool process's CPU and the wall time of each step."""
    import cProfile
    import pstats
    import tempfile

    from photojobs.testing.samples import generate_samples
    from photos import exiftool
    from store import jobs as store_jobs
    from store.engine import make_engine
    from store.lanes import lane_spec
    from tests import fresh_stores
    from tests.inline_lanes import run_lane

    tmp = Path(tempfile.mkdtemp(prefix="pj-exif-profile-"))
    try:
        engine = make_engine(fresh_stores.sqlite_copy(fresh_stores.sqlite_template(tmp), tmp / "pj.db"))
        root = tmp / "photos"
        photos = generate_samples(root, n + 3, seed=40, size=size)
        params = {"exif.keywords": ["Bench"], "exif.rating": 4}

        def job(batch: list[Path]) -> int:
            inputs = [store_jobs.PhotoInput(str(p), p.stat().st_size, p.stat().st_mtime) for p in batch]
            spec = lane_spec("exif", env={})
            return store_jobs.submit(engine, [spec], inputs, params=params, roots=[str(root)]).job_id

        run_lane(engine, job(photos[:3]), "exif")  # warm: imports, exiftool, the store's caches
        measured = job(photos[3:])

        def tool_cpu() -> float:
            stat = Path(f"/proc/{exiftool.ExifTool.shared().pid}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        tool0, cpu0, wall0 = tool_cpu(), time.process_time(), time.perf_counter()
        prof = cProfile.Profile()
        prof.enable()
        run_lane(engine, measured, "exif")
        prof.disable()
        wall, cpu, tool = time.perf_counter() - wall0, time.process_time() - cpu0, tool_cpu() - tool0
        engine.dispose()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    print(f"the exif lane's item ({size[0]}x{size[1]}, keyword + rating, SQLite), mean of {n}:")
    print(f"  wall {1000 * wall / n:.1f} ms; this process's CPU {1000 * cpu / n:.1f} ms (cProfile's "
          f"overhead included); exiftool's CPU {1000 * tool / n:.1f} ms")  # fmt: skip
    for label, where, name in _LANE_STEPS:
        hits = [v for (f, _, fn), v in stats.items() if fn == name and (where == "~" or f.endswith(where))]
        seconds, calls = sum(v[3] for v in hits), sum(v[1] for v in hits)
        print(f"  {label:42s} {1000 * seconds / n:7.1f} ms wall  ({calls / n:.1f} calls)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--photos", type=int, default=int(os.environ.get("PJBENCH_PHOTOS", 400)))
    parser.add_argument("--size", default="1600x1200")
    parser.add_argument("--store", default="sqlite", choices=("sqlite", "postgres"))
    parser.add_argument("--profile", action="store_true", help="where one photo's time goes (in process)")
    parser.add_argument(
        "--profile-lane", action="store_true",
        help="the whole item (store, history, fsyncs too) in process under cProfile",
    )  # fmt: skip
    args = parser.parse_args(argv)
    width, height = (int(v) for v in args.size.lower().split("x"))
    sys.path.insert(0, str(HERE))
    if args.profile:
        profile((width, height))
        return 0
    if args.profile_lane:
        profile_lane((width, height))
        return 0
    run(args.photos, (width, height), args.store)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
