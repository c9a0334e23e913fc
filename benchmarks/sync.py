"""What a sync costs: the first sync of a library against a sync of the same library unchanged, and a
watcher's CPU while nothing changes (issue 38).

``python -m benchmarks.sync [--photos 2000 100000] [--stores sqlite postgresql] [--real] [--idle 100000]``

For each size and store: a library of N files named ``IMG_NNNNNN.jpg`` in folders of 1,000 (each
file 200 bytes of its own content: the sync never decodes a photo, it stats and hashes files, so
the content's size only scales the first sync's hashing; ``--real``: camera-like sample JPEGs of
1600x1200, ~235 kB), a fresh store, then in child processes
(``benchmarks.sync_child``: its peak RSS is its own) the first sync, the no-change sync, the
no-change sync again, and the walk alone (``os.scandir`` + ``stat`` of every file: the floor).
Printed: wall and CPU time, statements, files hashed, peak RSS, and the no-change/first ratios.

``--idle N``: ``photojobs watch`` (inotify, then ``--poll`` every 5 s) over a library of N files,
after its first sync, its CPU over 30 s from ``/proc`` (utime + stime).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("PHOTOJOBS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def make_library(folder: Path, n: int, real: bool = False) -> None:
    if real:  # camera-like JPEGs, 1600x1200 (~235 kB each), one folder
        from photojobs.testing.samples import generate_samples

        generate_samples(folder, n, seed=38)
        return
    for i in range(n):
        sub = folder / f"{i // 1000:04d}"
        if i % 1000 == 0:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"IMG_{i:06d}.jpg").write_bytes(f"photo {i:08d} ".encode() * 12 + b"\xff\xd9" * 4)


def fresh_store(store: str, work: Path) -> tuple[str, Any]:
    if store == "sqlite":
        url = f"sqlite:///{work / 'bench.db'}"
        cleanup = None
    else:
        import psycopg

        name = f"pj_bench_sync_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"

        def cleanup() -> None:
            with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    from store.engine import make_engine
    from store.schema import upgrade

    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    return url, cleanup


def child(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.sync_child", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def load() -> str:
    return "load {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def measure(n: int, store: str, real: bool = False) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pj-bench-sync-"))
    cleanup = None
    try:
        lib = work / "library"
        make_library(lib, n, real)
        url, cleanup = fresh_store(store, work)
        out: dict[str, Any] = {"photos": n, "store": store, "real": real, "load_start": load()}
        out["first"] = child(url, str(lib))
        out["unchanged"] = child(url, str(lib))
        out["unchanged_again"] = child(url, str(lib))
        out["walk"] = child("--walk-only", str(lib))
        out["load_end"] = load()
        first, same = out["first"], out["unchanged"]
        out["ratio_wall"] = same["wall_s"] / first["wall_s"]
        out["ratio_cpu"] = same["cpu_s"] / first["cpu_s"]
        return out
    finally:
        if cleanup:
            cleanup()
        shutil.rmtree(work, ignore_errors=True)


def _cpu_of(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_watch(n: int, seconds: float = 30.0) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="pj-bench-watch-"))
    rows = []
    try:
        lib = work / "library"
        make_library(lib, n)
        url, _ = fresh_store("sqlite", work)
        env = {**os.environ, "PHOTOJOBS_DATABASE_URL": url, "PHOTOJOBS_REDIS_URL": "redis://127.0.0.1:1/0"}
        for mode in ([], ["--poll", "--poll-interval", "5"]):
            out = work / f"watch{len(rows)}.out"
            with open(out, "wb") as stdout:
                command = ["watch", "--lanes", "analysis", "--json", *mode, str(lib)]
                proc = subprocess.Popen(
                    [sys.executable, "-m", "photojobs", *command],
                    cwd=ROOT, env=env, stdout=stdout, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            try:
                deadline = time.monotonic() + 1800
                while not out.read_text().strip():  # its first sync reported
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("the watcher did not start")
                    time.sleep(0.5)
                time.sleep(12 if mode else 2)  # the polling observer's first snapshot is taken at start
                c0, t0, l0 = _cpu_of(proc.pid), time.monotonic(), load()
                time.sleep(seconds)
                cpu, wall = _cpu_of(proc.pid) - c0, time.monotonic() - t0
                rows.append({
                    "mode": "polling every 5 s" if mode else "inotify", "photos": n, "cpu_s": cpu,
                    "wall_s": wall, "share_of_a_core": cpu / wall, "load": f"{l0} -> {load()}",
                })  # fmt: skip
            finally:
                proc.terminate()
                proc.wait(timeout=30)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--photos", type=int, nargs="*", default=[2000, 100_000])
    parser.add_argument("--stores", nargs="*", default=["sqlite", "postgresql"])
    parser.add_argument("--idle", type=int, default=0, help="also measure an idle watcher over N files")
    parser.add_argument("--real", action="store_true", help="sample JPEGs (1600x1200) instead of small files")
    args = parser.parse_args()
    for n in args.photos:
        for store in args.stores:
            print(json.dumps(measure(n, store, args.real)), flush=True)
    if args.idle:
        for row in idle_watch(args.idle):
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
