"""A running fleet's claims and heartbeats beside a big submission, on PostgreSQL (issue 32).

``python -m benchmarks.submit_beside_fleet [FILES]`` (default 100,000): ``photojobs submit`` of
FILES empty files in a child process while this process runs another job's no-op batches of 16 —
batch claim, heartbeat ``renew``, batch finish, as a worker thread does — in a loop, with
``pg_stat_activity`` sampled every 10 ms for backends waiting on a lock; then the same loop as long
again without the submission. Prints each operation's median, p99 and max latency both ways and
the share of samples with a backend waiting on a lock. The admin URL: ``PHOTOJOBS_TEST_PG``.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg

from .million import make_tree

ADMIN = os.environ.get("PHOTOJOBS_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")


def _loop(engine: Any, spec: Any, seconds: float, lat: dict[str, list[float]]) -> None:
    """Dispatch, claim, renew and finish the other job's items for ``seconds``."""
    from store import items as store_items
    from store.dispatch import take_for_dispatch
    from store.fencing import fenced_batch

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        groups: dict[Any, list[tuple[int, int]]] = {}
        for k, p in enumerate(take_for_dispatch(engine, spec)):
            groups.setdefault(p.group if p.group is not None else k, []).append((p.item_id, p.token))
        if not groups:
            return
        for pairs in groups.values():
            t = time.perf_counter()
            out = store_items.claim_batch(engine, spec, pairs, "beside", dict.fromkeys(i for i, _ in pairs))
            lat["claim"].append(time.perf_counter() - t)
            leases = [o.lease for o in out if o.lease is not None]
            t = time.perf_counter()
            store_items.renew(engine, {x.item_id: x.token for x in leases})
            lat["renew"].append(time.perf_counter() - t)
            t = time.perf_counter()
            with fenced_batch(engine, [x.item_id for x in leases]) as s:
                store_items.lock_batch_finish(s, leases, {x.item_id for x in leases})
                store_items.succeed_many(s, [(x, None) for x in leases], "beside")
            lat["finish"].append(time.perf_counter() - t)


def _report(tag: str, lat: dict[str, list[float]]) -> None:
    for op, values in lat.items():
        v = sorted(values)
        if v:
            print(
                f"{tag}: {op} n={len(v)} median {1000 * statistics.median(v):.1f} ms "
                f"p99 {1000 * v[int(len(v) * 0.99)]:.1f} ms max {1000 * v[-1]:.1f} ms"
            )


def main(argv: list[str]) -> int:
    from store import jobs as store_jobs
    from store.engine import make_engine
    from store.lanes import all_lanes
    from store.schema import upgrade

    n = int(argv[0]) if argv else 100_000
    name = f"pjbench_beside_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = ADMIN.rsplit("/", 1)[0] + f"/{name}"
    engine = make_engine(url)
    try:
        upgrade(engine)
        spec = all_lanes({"PHOTOJOBS_FLEET_PROCESSES": "2"})["noop"]
        photos = [store_jobs.PhotoInput(f"/beside/{i:07d}.jpg", 1) for i in range(200_000)]
        store_jobs.submit(engine, [spec], photos)  # the other job: more than both loops need
        with tempfile.TemporaryDirectory() as tmp:
            tree = make_tree(Path(tmp) / "tree", n)
            waits: list[int] = []
            stop = threading.Event()

            def sample() -> None:
                with psycopg.connect(url, autocommit=True) as c:
                    while not stop.is_set():
                        row = c.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                            "AND wait_event_type = 'Lock'"
                        ).fetchone()
                        waits.append(int(row[0]) if row else 0)
                        time.sleep(0.01)

            sampler = threading.Thread(target=sample)
            sampler.start()
            cmd = [sys.executable, "-m", "photojobs", "submit", "--lanes", "noop", "--param", "noop.sleep=0"]
            env = {**os.environ, "PHOTOJOBS_DATABASE_URL": url}
            t0 = time.monotonic()
            proc = subprocess.Popen([*cmd, "--json", str(tree)], env=env, stdout=subprocess.DEVNULL)
            during: dict[str, list[float]] = {"claim": [], "renew": [], "finish": []}
            while proc.poll() is None:
                _loop(engine, spec, 1.0, during)
            took = time.monotonic() - t0
            stop.set()
            sampler.join()
            print(
                f"submission of {n:,} files: {took:.1f} s, exit {proc.returncode}; a backend waited on a "
                f"lock in {sum(1 for w in waits if w)} of {len(waits)} samples; load {os.getloadavg()[0]:.1f}"
            )
            _report("during the submission", during)
            after: dict[str, list[float]] = {"claim": [], "renew": [], "finish": []}
            _loop(engine, spec, took, after)
            _report("after it", after)
    finally:
        engine.dispose()
        with psycopg.connect(ADMIN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
