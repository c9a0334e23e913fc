"""The worker registry (table ``workers``, revision 0005): every worker process reports itself once
per heartbeat, so an idle worker is visible too, and a worker whose beats stopped shows as stale.

- ``beat``: one upsert per beat (and one at boot): lanes, interval, items held, last beat = the
  database clock. A beat never clears ``stopped_at``: a late beat after a clean stop is harmless.
- ``mark_stopped``: a clean shutdown.
- ``forget_stale``: the sweeper deletes rows whose last beat is older than a retention age.
- ``registered``: the rows, for ``store.listing.workers``.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from .clock import db_now
from .engine import reader
from .events import emit
from .models import Worker

# The sweeper forgets a worker whose last beat is older than this (seconds).
FORGET_AFTER = 3600.0


def parse_identity(worker_id: str) -> tuple[str, int | None]:
    """``"host:pid:nonce"`` -> (host, pid); a pid that is not a number gives None."""
    host, _, rest = worker_id.partition(":")
    pid_text = rest.split(":", 1)[0]
    return host, int(pid_text) if pid_text.isdigit() else None


MAX_RUNNING = 256  # threads reported per beat (a process has a handful)


def beat(
    engine: Engine,
    worker_id: str,
    *,
    lanes: Sequence[str],
    interval: float,
    held: int,
    threads: int | None = None,
    running: Sequence[dict[str, Any]] | None = None,
) -> None:
    """Record a beat of ``worker_id`` in one statement: insert it (started now) or refresh its lanes,
    interval, items held, thread count, what each busy thread runs (``running``: ``[{"thread",
    "item", "age"}]``, None: not reported) and last beat (database clock)."""
    host, pid = parse_identity(worker_id)
    dialect = postgresql if engine.dialect.name == "postgresql" else sqlite
    values: dict[str, Any] = {
        "id": worker_id,
        "host": host or socket.gethostname(),
        "pid": pid,
        "lanes": sorted(lanes),
        "interval": float(interval),
        "started_at": db_now(),
        "last_beat": db_now(),
        "items_held": int(held),
        "stopped_at": None,
        "threads": threads,
        "running": None if running is None else list(running)[:MAX_RUNNING],
    }
    stmt = dialect.insert(Worker).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=[Worker.id],
        set_={
            "lanes": stmt.excluded.lanes,
            "interval": stmt.excluded.interval,
            "last_beat": stmt.excluded.last_beat,
            "items_held": stmt.excluded.items_held,
            "threads": stmt.excluded.threads,
            "running": stmt.excluded.running,
        },
    )
    with Session(engine) as s, s.begin():
        s.execute(stmt)


def mark_stopped(engine: Engine, worker_id: str, *, held: int = 0) -> bool:
    """A clean shutdown of ``worker_id``: ``stopped_at`` = now (database clock). False if unknown."""
    with Session(engine) as s, s.begin():
        done = s.execute(
            update(Worker)
            .where(Worker.id == worker_id)
            .values(stopped_at=db_now(), last_beat=db_now(), items_held=held, running=[])
        ).rowcount
    return bool(done)


def forget_stale(engine: Engine, older_than: float = FORGET_AFTER) -> int:
    """Delete the workers whose last beat is older than ``older_than`` seconds (stopped or dead);
    returns how many. A range of ``ix_workers_last_beat``."""
    if not older_than > 0:
        raise ValueError(f"older_than must be positive, not {older_than!r}")
    with Session(engine) as s, s.begin():
        return int(s.execute(delete(Worker).where(Worker.last_beat < db_now() - older_than)).rowcount or 0)


@dataclass
class WorkerRow:
    id: str
    host: str
    pid: int | None
    lanes: list[str]
    interval: float
    started_at: float
    last_beat: float
    items_held: int
    stopped_at: float | None
    threads: int | None = None
    running: list[dict[str, Any]] | None = None


def registered(engine: Engine) -> tuple[float, list[WorkerRow]]:
    """(database now, every registered worker)."""
    with Session(reader(engine)) as s:
        now = float(s.execute(select(db_now())).scalar_one())
        rows = [
            WorkerRow(
                id=w.id,
                host=w.host,
                pid=w.pid,
                lanes=list(w.lanes or []),
                interval=w.interval,
                started_at=w.started_at,
                last_beat=w.last_beat,
                items_held=w.items_held,
                stopped_at=w.stopped_at,
                threads=w.threads,
                running=list(w.running) if isinstance(w.running, list) else None,
            )
            for w in s.execute(select(Worker)).scalars()
        ]
    return now, rows


# A worker process the supervisor restarts, by why it ended (issue 41: a crash loop is alerted on).
# One event type per reason, folded by ``store.counters`` like any event (never goes back).
RESTART_EVENTS = {"crashed": "worker_crashed", "killed": "worker_killed", "recycled": "worker_recycled"}


def record_exit(engine: Engine, reason: str, *, worker: str, detail: dict[str, Any] | None = None) -> None:
    """Record that a supervised worker process ended unexpectedly for ``reason`` (``crashed``: a
    non-zero exit, ``killed``: a signal, ``recycled``: a clean exit the supervisor did not ask for);
    ``worker``: ``host:pid``."""
    if reason not in RESTART_EVENTS:
        raise ValueError(f"unknown restart reason {reason!r}; reasons: {', '.join(RESTART_EVENTS)}")
    with Session(engine) as s, s.begin():
        emit(s, RESTART_EVENTS[reason], worker=worker, detail=detail)
