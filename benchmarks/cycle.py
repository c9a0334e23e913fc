"""The store's work per no-op item, by phase, as a worker does it with batch messages — load-proof.

One thread, one pooled connection, no workers or Redis: a job's items go through the phases a fleet
puts them through — the dispatch (``take_for_dispatch``, the lane's item bound), the batch claim of
each message (``claim_batch``, as ``middleware.claiming.BatchClaim``), the batch finish
(``fenced_batch`` + ``lock_batch_finish`` + ``succeed_many``, as
``middleware.finishing.Finisher.finish_batch``) and the numbering of their events
(``assign_cursors``, the sweeper's ``events`` duty). Per item and phase it counts the statements
sent, the round trips (statements + ``BEGIN``/``COMMIT``/``ROLLBACK`` + the pool's pre-ping), this
process's CPU and the PostgreSQL backend's CPU (``/proc/<backend pid>/stat``) — none of which the
machine's load changes much, unlike wall time.

Sizes: ``PJBENCH_CYCLE_ITEMS`` items cycled (default 8,000; ``--quick`` 2,000), on a fresh database
and again on one grown by ``PJBENCH_CYCLE_HISTORY`` finished items with four numbered events each
(default 250,000; ``--quick`` 20,000): the store of a job that far along.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from .harness import BenchContext, BenchmarkError, StoreUnavailable, failed_row
from .registry import Row, register

NAME = "cycle"
WORKER = "bench:0:cycle"
PHASES = ("dispatch", "claim", "finish", "number events")


def _backend_cpu(pid: int) -> float:
    """CPU seconds of a process so far, to the nanosecond (``/proc/<pid>/schedstat``)."""
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


class Meter:
    """Per phase: statements, round trips, this thread's CPU and the backend's CPU."""

    def __init__(self, engine: Any, backend: int | None) -> None:
        from sqlalchemy import event

        self.backend = backend
        self.statements: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.trips: dict[str, int] = dict.fromkeys(PHASES, 0)
        self.cpu: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.db_cpu: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self.kinds: dict[str, int] = {}
        self.phase: str | None = None

        def stmt(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            if self.phase is None:
                return
            self.statements[self.phase] += 1
            self.trips[self.phase] += 1
            key = f"{self.phase}: {' '.join(statement.split())[:70]}"
            self.kinds[key] = self.kinds.get(key, 0) + 1

        def trip(*_: Any) -> None:
            if self.phase is not None:
                self.trips[self.phase] += 1

        event.listen(engine, "before_cursor_execute", stmt)
        for name in ("begin", "commit", "rollback"):
            event.listen(engine, name, trip)
        if getattr(engine.pool, "_pre_ping", False):  # pool_pre_ping: one round trip per checkout
            event.listen(engine.pool, "checkout", lambda *a: trip())

    def __call__(self, phase: str, fn: Callable[[], Any]) -> Any:
        self.phase = phase
        c0 = time.thread_time()
        d0 = _backend_cpu(self.backend) if self.backend else 0.0
        try:
            return fn()
        finally:
            self.cpu[phase] += time.thread_time() - c0
            if self.backend:
                self.db_cpu[phase] += _backend_cpu(self.backend) - d0
            self.phase = None


def _grow(engine: Any, finished: int) -> None:
    """A store ``finished`` items further along: succeeded items of an older job and their four
    numbered events each (created, queued, claimed, succeeded)."""
    from sqlalchemy import text

    from photojobs.testing import scale

    scale.seed_pending(engine, 0, jobs=1, finished=finished)
    with engine.begin() as conn:
        conn.execute(
            text(
                """
                INSERT INTO events (seq, type, job_id, item_id, photo_id, lane, attempt, token, worker, at)
                WITH t(k, type) AS (VALUES (1, 'item_created'), (2, 'item_queued'),
                    (3, 'item_claimed'), (4, 'item_succeeded'))
                SELECT row_number() OVER (ORDER BY i.id, t.k), t.type, i.job_id, i.id, i.photo_id,
                       'noop', 1, 1, 'seed', 0.0
                FROM items i CROSS JOIN t
                WHERE i.state = 'succeeded'
                """
            )
        )
    with engine.connect() as conn:
        auto = conn.execution_options(isolation_level="AUTOCOMMIT")
        auto.exec_driver_sql("VACUUM ANALYZE" if engine.dialect.name == "postgresql" else "ANALYZE")


def _cycle(ctx: BenchContext, store: str, n: int, history: int) -> tuple[Meter, int]:
    from sqlalchemy import text

    from photojobs.testing import scale
    from store import items as store_items
    from store.dispatch import take_for_dispatch
    from store.engine import make_engine
    from store.events import assign_cursors
    from store.fencing import fenced_batch
    from store.lanes import all_lanes

    url = ctx.dbs.create(store, NAME)
    engine = make_engine(url, pool_size=1)
    try:
        spec = all_lanes({"PHOTOJOBS_FLEET_PROCESSES": "2"})["noop"]
        if history:
            _grow(engine, history)
        scale.seed_pending(engine, n, jobs=1)
        backend = None
        if store == "postgresql":
            with engine.connect() as conn:
                backend = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
        meter = Meter(engine, backend)
        done = 0
        while done < n:
            published = meter("dispatch", lambda: take_for_dispatch(engine, spec))
            if not published:
                break
            groups: dict[Any, list[tuple[int, int]]] = {}
            for k, p in enumerate(published):
                groups.setdefault(p.group if p.group is not None else f"alone-{k}", []).append(
                    (p.item_id, p.token)
                )
            for pairs in groups.values():
                requests = dict.fromkeys((i for i, _ in pairs), None)
                outcomes = meter(
                    "claim",
                    lambda pairs=pairs, requests=requests: store_items.claim_batch(
                        engine, spec, pairs, WORKER, requests
                    ),
                )
                leases = [o.lease for o in outcomes if o.lease is not None]
                if len(leases) != len(pairs):
                    raise BenchmarkError(f"claimed {len(leases)} of {len(pairs)}")

                def finish(leases: list[Any] = leases) -> None:
                    # as middleware.finishing.Finisher.finish_batch: the plain successes together
                    with fenced_batch(engine, [x.item_id for x in leases]) as s:
                        plain = [x for x in leases if store_items.plain_success(x)]
                        store_items.lock_batch_finish(s, leases, {x.item_id for x in plain})
                        store_items.succeed_many(s, [(x, None) for x in plain], WORKER)
                        for lease in leases:
                            if not store_items.plain_success(lease):
                                store_items.succeed(s, lease, None, WORKER, ())

                meter("finish", finish)
                done += len(leases)
            meter("number events", lambda: assign_cursors(engine))
        return meter, done
    finally:
        engine.dispose()
        ctx.dbs.drop(url)


@register(
    NAME, "The store's statements, round trips and CPU per no-op item, by phase (load-proof)", default=False
)
def cycle(ctx: BenchContext) -> list[Row]:
    """A batch worker's store work per item, on a fresh store and on a grown one, each store."""
    quick = ctx.config.quick
    n = int(os.environ.get("PJBENCH_CYCLE_ITEMS") or (2000 if quick else 8000))
    history = int(os.environ.get("PJBENCH_CYCLE_HISTORY") or (20_000 if quick else 250_000))
    ctx.note(settings={"items cycled": n, "grown store: finished items (4 events each)": history})
    rows: list[Row] = []
    for store in ctx.config.stores:
        for grown in (0, history):
            case = f"{store}, {'fresh store' if not grown else f'{grown:,} items further'}"
            try:
                meter, done = _cycle(ctx, store, n, grown)
            except (BenchmarkError, StoreUnavailable) as exc:
                rows.append(failed_row(NAME, case, "per item", exc))
                continue
            except Exception as exc:  # noqa: BLE001 - a row saying so, the other cases still run
                rows.append(failed_row(NAME, case, "per item", BenchmarkError(str(exc)[:400])))
                continue
            for phase in PHASES:
                rows.append(
                    Row(
                        NAME,
                        case,
                        phase,
                        round(meter.statements[phase] / done, 3),
                        "statements/item",
                        note=f"round trips {meter.trips[phase] / done:.3f}/item; CPU per item: "
                        f"client {1000 * meter.cpu[phase] / done:.3f} ms, "
                        f"backend {1000 * meter.db_cpu[phase] / done:.3f} ms",
                        detail={
                            "round_trips_per_item": round(meter.trips[phase] / done, 3),
                            "client_cpu_ms_per_item": round(1000 * meter.cpu[phase] / done, 4),
                            "backend_cpu_ms_per_item": round(1000 * meter.db_cpu[phase] / done, 4),
                            "statements": {k: v for k, v in meter.kinds.items() if k.startswith(phase)},
                        },
                    )
                )
            total = (sum(meter.cpu.values()) + sum(meter.db_cpu.values())) * 1000 / done
            rows.append(
                Row(
                    NAME,
                    case,
                    "all phases",
                    round(sum(meter.statements.values()) / done, 3),
                    "statements/item",
                    note=f"round trips {sum(meter.trips.values()) / done:.3f}/item; CPU {total:.3f} ms/item "
                    f"(client {1000 * sum(meter.cpu.values()) / done:.3f}, "
                    f"backend {1000 * sum(meter.db_cpu.values()) / done:.3f})",
                )
            )
    return rows
