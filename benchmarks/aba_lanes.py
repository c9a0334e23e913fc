"""The exif and rename lanes' worker CPU per photo, A-B-A: this checkout against another (issue 37).

``python -m benchmarks.aba_lanes OTHER_CHECKOUT [--rounds 2] [--photos 200]`` runs, alternately in
OTHER_CHECKOUT and in this one (each its own code: the workers start in its folder), an exif job
(``exif.rating=4``) and a rename job (the default pattern) over ``--photos`` sample photos
(800 × 600) through 2 harness workers × 2 threads on SQLite, after a warm-up job each, and prints
the worker processes' CPU per photo (their process groups from ``/proc``: exiftool included; the
machine's load moves it far less than wall time), each run's load, and the medians' ratio. Make the
other checkout with ``mkdir ../base && git archive BASE | tar -x -C ../base`` (it uses this
interpreter's packages).

``--ops`` measures the file operations alone, the same way (A-B-A, each in its own code): per
photo, what the rename lane does to the disk (a staged hard link, the no-clobber move into a new
folder, the old name dropped) and what the exif lane does (a staged copy written, hashed, the
original kept in the history store, the atomic replace), 2,000 times on tmpfs (``/dev/shm``: no
disk, so an ``fsync`` costs nothing and what is left is the code and its system calls), in process
CPU time per photo.

``--one`` (internal): one exif and one rename run in the current directory's checkout, as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent.parent
LANES = {"exif": {"exif.rating": "4"}, "rename": {}}


def one(photos: int) -> dict[str, Any]:
    """An exif and a rename run of the checkout in the current directory (its own code)."""
    sys.path.insert(0, os.getcwd())
    from benchmarks import cpu
    from benchmarks.harness import BenchContext, Config
    from benchmarks.throughput import run_photojobs
    from photojobs.testing.samples import generate_samples

    ctx = BenchContext(Config(photos=photos))
    import photos as package

    out: dict[str, Any] = {"code": str(Path(package.__file__ or "").parent.parent)}
    try:
        ctx.open()
        ctx.current = "aba_lanes"
        for lane, params in LANES.items():
            folder, warm = ctx.workdir / f"{lane}-photos", ctx.workdir / f"{lane}-warm"
            generate_samples(folder, photos, seed=11, size=(800, 600))
            generate_samples(warm, 20, seed=12, size=(800, 600))
            load0 = cpu.loadavg()
            m = run_photojobs(
                ctx, "sqlite", lane=lane, folder=folder, warm_folder=warm, params=params, note_commands=False
            )
            out[lane] = {
                "workers_ms": round(m.cpu_ms.get("workers", 0.0), 2),
                "photos": m.count,
                "rate": round(m.rate, 1),
                "load": f"{load0:.1f} -> {cpu.loadavg():.1f}",
            }
    finally:
        ctx.close()
    return out


def ops(n: int) -> dict[str, Any]:
    """The rename and exif lanes' file operations per photo, in the current directory's checkout
    (before issue 37: by path; after: beneath a ``Roots`` by descriptor)."""
    import hashlib
    import tempfile

    sys.path.insert(0, os.getcwd())
    from photos import fileops, history, recovery

    confined = hasattr(fileops, "write_new")
    base = Path(tempfile.mkdtemp(prefix="pj-ops-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    kw: dict[str, Any] = {}
    if confined:
        from photos.rootfs import Roots

        kw = {"within": Roots([base])}
    (base / "in").mkdir()
    data = os.urandom(200_000)
    sha = hashlib.sha256(data).hexdigest()
    for i in range(n):
        (base / "in" / f"p{i}.jpg").write_bytes(data)
    t0 = time.process_time()
    for i in range(n):  # rename: staged link, move into a new dated folder, old name dropped
        src = base / "in" / f"p{i}.jpg"
        staged = recovery.link_staged(src, "i1-t1", **kw)
        target = base / "out" / f"d{i % 50}" / f"p{i}.jpg"
        fileops.move_no_clobber(staged, target, sha, **kw)
        recovery.drop_moved_source(str(src), str(target), sha, **kw)
    t1 = time.process_time()
    for i in range(n):  # exif: the edited copy staged and hashed, the original kept, the replace
        target = base / "out" / f"d{i % 50}" / f"p{i}.jpg"
        staged = fileops.stage_bytes(target, "i2-t1", data[:-1] + bytes([i % 256]), **kw)
        if confined:
            fileops.content_sha256(staged, **kw)
            history.keep(target, sha, **kw)
        else:
            fileops.sha256_file(staged)
            history.keep(target, sha, history.store_for(base))
        fileops.replace_atomic(staged, target, **kw)
    t2 = time.process_time()
    return {"rename_us": round(1e6 * (t1 - t0) / n, 1), "exif_us": round(1e6 * (t2 - t1) / n, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.aba_lanes", description=__doc__.split("\n\n")[0])
    p.add_argument("other", nargs="?", type=Path, help="the other revision's checkout")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--photos", type=int, default=200)
    p.add_argument("--ops", action="store_true", help="the file operations alone, on tmpfs")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(ops(2000) if a.ops else one(a.photos)))
        return 0
    if a.other is None:
        p.error("name the other checkout")
    order = [a.other.resolve(), HERE]
    runs: list[tuple[str, dict[str, Any]]] = []
    for r in range(a.rounds * 2 + 1):  # A B A B ... A
        checkout = order[r % 2]
        t0 = time.time()
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--one", "--photos", str(a.photos),
             *(["--ops"] if a.ops else [])],
            cwd=checkout, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
            return 1
        got = json.loads(done.stdout.strip().splitlines()[-1])
        label = "A (other)" if checkout != HERE else "B (this)"
        runs.append((label, got))
        if a.ops:
            print(f"run {r + 1} {label}: rename {got['rename_us']}, exif {got['exif_us']} us", flush=True)
            continue
        print(
            f"run {r + 1} {label} code={got['code']} ({time.time() - t0:.0f} s): "
            + "; ".join(
                f"{lane} {got[lane]['workers_ms']} ms/photo, {got[lane]['rate']}/s, load {got[lane]['load']}"
                for lane in LANES
            ),
            flush=True,
        )
    for lane in LANES:
        key, unit = (f"{lane}_us", "us") if a.ops else (lane, "ms")
        a_v = [g[key] if a.ops else g[lane]["workers_ms"] for label, g in runs if label.startswith("A")]
        b_v = [g[key] if a.ops else g[lane]["workers_ms"] for label, g in runs if label.startswith("B")]
        ma, mb = statistics.median(a_v), statistics.median(b_v)
        what = "file operations' CPU" if a.ops else "worker CPU"
        print(f"{lane}: {what} per photo, median A {ma:.2f} {unit}, B {mb:.2f} {unit}: "
              f"B-A = {mb - ma:+.2f} {unit}, B/A = {mb / ma:.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
