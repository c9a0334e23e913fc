"""An instrumented photojobs worker process: the product's broker and middleware, plus counters.

Run as ``python -m dramatiq benchmarks.probe --processes 1 --threads T --queues photojobs.noop``
with ``PJBENCH_PROBE_OUT=<file>``. It imports ``actors`` (the broker ``photojobs worker`` runs:
every middleware, every lane) and adds, without changing any of it:

- a middleware first in the chain and one last, which take ``time.thread_time()`` around the
  ``before_process_message`` hooks (the claim) and the ``after_process_message`` hooks (the fenced
  finish and the lane top-up) of each lane message: the CPU of the worker thread in the store path;
- ``thread_time`` wrappers on ``RedisPublisher.publish`` / ``queue_length`` (Redis client work of
  the top-up, subtracted from the store figure) and on ``middleware.top_up``'s ``take_for_dispatch``
  when it has one (the dispatch part of the finish hook);
- ``thread_time`` wrappers on ``Heartbeat.beat`` and ``Presence.beat`` (the renew share: the
  heartbeat thread's CPU);
- SQLAlchemy engine events on the worker's engine: the time from ``BEGIN`` (SQLite: after the
  runtime's own ``begin`` listener issued ``BEGIN IMMEDIATE``, i.e. once the write lock is ours)
  to the end of ``COMMIT``/``ROLLBACK``, summed over write transactions.

A thread writes the cumulative counters to ``PJBENCH_PROBE_OUT`` (JSON) every 0.1 s; the benchmark
reads them before and after its measured job and subtracts.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import dramatiq
from dramatiq.middleware import Middleware

COUNTERS = (
    "items",  # items of the lane messages through the after_process_message hooks (a batch: several)
    "cpu_before",  # thread CPU in the before_process_message chain (the claim), s
    "cpu_after",  # thread CPU in the after_process_message chain (finish + top-up), s
    "cpu_dispatch",  # of which take_for_dispatch, s
    "cpu_redis",  # of which RedisPublisher calls (client side), s
    "cpu_heartbeat",  # Heartbeat.beat + Presence.beat (renew share), s
    "beats",
    "held_write",  # write transactions: BEGIN (IMMEDIATE) -> end of COMMIT/ROLLBACK, s
    "held_write_cpu",  # the holding thread's CPU in that time, s
    "write_transactions",
    "held_read",  # read-only transactions (plain BEGIN on SQLite: no write lock), s
)


class Counters:
    """Cumulative, thread-safe counters (``add``) and a JSON snapshot (``dump``)."""

    def __init__(self) -> None:
        self.values = dict.fromkeys(COUNTERS, 0.0)
        self.lock = threading.Lock()
        self.worker = ""

    def add(self, **deltas: float) -> None:
        with self.lock:
            for k, v in deltas.items():
                self.values[k] += v

    def dump(self, path: Path) -> None:
        with self.lock:
            data = {**self.values, "worker": self.worker, "pid": os.getpid(), "at": time.time()}
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        tmp.replace(path)


COUNTS = Counters()
_local = threading.local()


def _timed(key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with its thread CPU added to counter ``key``."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        c0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            COUNTS.add(**{key: time.thread_time() - c0})

    return wrapper


class _First(Middleware):
    """First in the chain: starts the before-hooks clock, stops the after-hooks clock."""

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        _local.before = time.thread_time()

    def after_process_message(
        self, broker: dramatiq.Broker, message: dramatiq.Message, *, result: Any = None, exception: Any = None
    ) -> None:
        t0 = getattr(_local, "after", None)
        if t0 is not None and message.actor_name.startswith("lane_"):
            COUNTS.add(items=len(message.args) // 2, cpu_after=time.thread_time() - t0)
        _local.after = None

    def after_skip_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        _local.after = None


class _Last(Middleware):
    """Last in the chain: stops the before-hooks clock, starts the after-hooks clock."""

    def before_process_message(self, broker: dramatiq.Broker, message: dramatiq.Message) -> None:
        t0 = getattr(_local, "before", None)
        if t0 is not None and message.actor_name.startswith("lane_"):
            COUNTS.add(cpu_before=time.thread_time() - t0)
        _local.before = None

    def after_process_message(
        self, broker: dramatiq.Broker, message: dramatiq.Message, *, result: Any = None, exception: Any = None
    ) -> None:
        _local.after = time.thread_time()


def _watch_engine(engine: Any) -> None:
    """Time each transaction on ``engine`` from BEGIN to the end of COMMIT/ROLLBACK."""
    from sqlalchemy import event

    dialect = engine.dialect

    def began(conn: Any) -> None:
        read_only = bool(conn.get_execution_options().get("photojobs_read_only", False))
        _local.txn = (time.perf_counter(), read_only, time.thread_time())

    def ended(original: Callable[[Any], None]) -> Callable[[Any], None]:
        def end(dbapi_conn: Any) -> None:
            try:
                original(dbapi_conn)
            finally:
                txn = getattr(_local, "txn", None)
                _local.txn = None
                if txn is not None:
                    held = time.perf_counter() - txn[0]
                    if txn[1]:
                        COUNTS.add(held_read=held)
                    else:
                        cpu = time.thread_time() - txn[2]
                        COUNTS.add(held_write=held, held_write_cpu=cpu, write_transactions=1)

        return end

    event.listen(engine, "begin", began)  # after the runtime's listener: BEGIN IMMEDIATE has returned
    dialect.do_commit = ended(dialect.do_commit)
    dialect.do_rollback = ended(dialect.do_rollback)


def install(broker: dramatiq.Broker, out: Path) -> None:
    """Add the probes to ``broker`` (the product's) and start the dump thread."""
    from middleware import heartbeat, presence, top_up
    from photojobs import broker as pj_broker
    from photojobs.config import Settings
    from photojobs.runtime import engine_for

    broker.middleware.insert(0, _First())
    broker.middleware.append(_Last())
    for name in ("publish", "queue_length"):
        setattr(pj_broker.RedisPublisher, name, _timed("cpu_redis", getattr(pj_broker.RedisPublisher, name)))
    if hasattr(top_up, "take_for_dispatch"):
        top_up.take_for_dispatch = _timed("cpu_dispatch", top_up.take_for_dispatch)  # type: ignore[attr-defined]
    beat = heartbeat.Heartbeat.beat

    def counted_beat(self: Any) -> None:
        c0 = time.thread_time()
        try:
            beat(self)
        finally:
            COUNTS.add(cpu_heartbeat=time.thread_time() - c0, beats=1)

    heartbeat.Heartbeat.beat = counted_beat  # type: ignore[method-assign]
    presence.Presence.beat = _timed("cpu_heartbeat", presence.Presence.beat)  # type: ignore[method-assign]
    _watch_engine(engine_for(Settings.from_env().database_url))
    for m in broker.middleware:
        if hasattr(m, "worker") and hasattr(m, "presence"):
            lease_mw = m

    def dump_forever() -> None:
        while True:
            COUNTS.worker = getattr(lease_mw, "worker", "")  # set at process boot
            COUNTS.dump(out)
            time.sleep(0.1)

    threading.Thread(target=dump_forever, name="pjbench-probe", daemon=True).start()


def read(path: Path) -> dict[str, Any] | None:
    """The probe's latest counters (None before its first dump)."""
    try:
        data: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data


if os.environ.get("PJBENCH_PROBE_OUT"):  # imported by `dramatiq benchmarks.probe`
    import actors  # noqa: F401 - the product's broker and lanes

    install(dramatiq.get_broker(), Path(os.environ["PJBENCH_PROBE_OUT"]))
