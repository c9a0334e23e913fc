"""Store operations of the lease protocol, one thread, no contention: wall and CPU time per call.

What a worker does per no-op item is ``claim`` + fenced ``succeed`` + a lane top-up
(``take_for_dispatch``), and its heartbeat ``renew``s. Timing them alone, in this process, shows the
floor of photojobs' per-item cost and, on SQLite, how long each holds the single write lock (all of
it: every transaction there starts with ``BEGIN IMMEDIATE``). Also: an empty transaction through
the runtime's engine, with and without another connection open (SQLite's ``NullPool`` closes the
last connection after each transaction, which checkpoints and deletes the WAL).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from .harness import BenchContext, StoreUnavailable
from .registry import Row, register

NAME = "ops"
BOUND = 16
WORKER = "bench:0:ops"


class _Timer:
    """Wall, CPU and (via engine events) transaction-open time per named operation."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.held: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self.current = ""

    def watch(self, engine: Any) -> None:
        """Time from BEGIN (after the runtime's ``BEGIN IMMEDIATE``: listeners run in order) to COMMIT."""
        from sqlalchemy import event

        def began(conn: Any) -> None:
            conn.info["pjbench_begin"] = time.perf_counter()

        def ended(conn: Any) -> None:
            t0 = conn.info.pop("pjbench_begin", None)
            if t0 is not None and self.current:
                self.held[self.current] = self.held.get(self.current, 0.0) + time.perf_counter() - t0

        event.listen(engine, "begin", began)
        event.listen(engine, "commit", ended)
        event.listen(engine, "rollback", ended)

    def __call__(self, name: str, fn: Callable[[], Any]) -> Any:
        self.current = name
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            return fn()
        finally:
            self.current = ""
            self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - t0
            self.cpu[name] = self.cpu.get(name, 0.0) + time.process_time() - c0
            self.calls[name] = self.calls.get(name, 0) + 1


def _measure(ctx: BenchContext, store: str, n: int) -> _Timer:
    from sqlalchemy import text

    from photojobs.api import Client
    from photojobs.config import Settings
    from store import items as store_items
    from store.dispatch import take_for_dispatch
    from store.fencing import fenced

    url = ctx.dbs.create(store, "ops")
    client = None
    hold = None
    try:
        env = {"PHOTOJOBS_DATABASE_URL": url}
        client = Client(Settings.from_env(env), migrate=False)
        spec = client.specs["noop"]
        engine = client.engine
        client.submit(["noop"], [ctx.folder("ops", n + BOUND)])
        timer = _Timer()
        timer.watch(engine)
        take_for_dispatch(engine, spec, bound=BOUND - 1)  # the lane as a worker sees it: one slot free
        done = 0
        while done < n:
            published = timer(
                "take_for_dispatch (1 free slot)", lambda: take_for_dispatch(engine, spec, bound=BOUND)
            )
            if not published:
                break
            for p in published:
                outcome = timer(
                    "claim", lambda p=p: store_items.claim(engine, spec, p.item_id, p.token, WORKER)
                )
                lease = outcome.lease
                assert lease is not None, outcome.reason
                timer(
                    "renew (1 lease)",
                    lambda lease=lease: store_items.renew(engine, {lease.item_id: lease.token}),
                )

                def succeed(lease: Any = lease) -> None:
                    with fenced(engine, lease.item_id, lease.token, worker=WORKER, what="succeed") as s:
                        store_items.succeed(s, lease, {"ok": True}, WORKER)

                timer("fenced succeed", succeed)
                done += 1

        def empty() -> None:
            with engine.begin() as conn:
                conn.execute(text("SELECT 1"))

        for _ in range(200):
            timer("empty transaction", empty)
        if store == "sqlite":
            hold = sqlite3.connect(url.split("///", 1)[1])
            hold.execute("SELECT count(*) FROM jobs").fetchall()
            for _ in range(200):
                timer("empty transaction, another connection open", empty)
        return timer
    finally:
        if hold is not None:
            hold.close()
        if client is not None:
            client.engine.dispose()
        ctx.dbs.drop(url)


@register(NAME, "Store operations per call, one thread, no contention (the per-item floor)")
def store_ops(ctx: BenchContext) -> list[Row]:
    """Wall/CPU ms per call of each lease-protocol operation, per store."""
    n = max(50, min(400, ctx.config.items // 5))
    ctx.note(settings={"items": n, "lane": "noop", "bound": BOUND, "threads": 1})
    rows: list[Row] = []
    for store in ctx.config.stores:
        try:
            timer = _measure(ctx, store, n)
        except StoreUnavailable as exc:
            rows.append(Row(NAME, store, "operations", None, verdict="skipped", note=str(exc)))
            continue
        per_item = held_item = 0.0
        lock = "write lock held" if store == "sqlite" else "transaction open"
        for op, wall in timer.wall.items():
            calls = timer.calls[op]
            ms, cpu_ms = 1000 * wall / calls, 1000 * timer.cpu[op] / calls
            held_ms = 1000 * timer.held.get(op, 0.0) / calls
            if op in ("take_for_dispatch (1 free slot)", "claim", "fenced succeed"):
                per_item += ms
                held_item += held_ms
            rows.append(
                Row(
                    NAME,
                    store,
                    op,
                    round(ms, 2),
                    "ms",
                    note=f"CPU {cpu_ms:.2f} ms, {lock} {held_ms:.2f} ms; {calls} calls",
                    detail={"calls": calls, "cpu_ms": round(cpu_ms, 3), "held_ms": round(held_ms, 3)},
                )
            )
        rows.append(
            Row(
                NAME,
                store,
                "claim + succeed + top-up, per item",
                round(per_item, 2),
                "ms",
                note=f"{lock} {held_item:.2f} ms per item"
                + (
                    f": at most {1000 / held_item:.0f} items/s for any number of workers"
                    if store == "sqlite"
                    else ""
                ),
                detail={"held_ms": round(held_item, 3)},
            )
        )
    return rows
