"""The sweeper's nine duties as maintenance services, each calling its store function (SQL in store/)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Protocol

from sqlalchemy import Engine

from photojobs.maintenance.service import Maintenance, Service, SweepReport
from store.dispatch import Publish, mark_republished, stale_queued, take_for_dispatch
from store.events import assign_cursors
from store.idempotency import KEEP as IDEMPOTENCY_KEEP
from store.idempotency import prune_keys
from store.intents import settle_orphans, sweep_stray_staged
from store.lanes import LaneSpec
from store.submission import SUBMIT_ABANDONED, end_abandoned_submissions
from store.sweeper import revoke_expired
from store.vacuum import tables_due, vacuum_table
from store.workers import FORGET_AFTER, forget_stale

log = logging.getLogger("photojobs.sweeper")

__all__ = [
    "DispatchLane",
    "ForgetIdempotencyKeys",
    "ForgetWorkers",
    "NumberEvents",
    "Publisher",
    "RemoveStrayStaged",
    "Republish",
    "RevokeExpired",
    "SettleOrphans",
    "SweepReport",
    "VacuumTables",
    "default_services",
    "sweep_once",
]


class Publisher(Protocol):
    def publish(self, items: list[Publish]) -> None: ...

    def held(self, items: list[Publish]) -> set[str]:
        """The message ids of ``items`` whose message is still waiting for, or held by, a live
        worker (asked once per pass, for all stale queued items at once)."""
        ...


class RevokeExpired(Service):
    """Revoke expired leases (``store.sweeper.revoke_expired``): bump the token, release the locks,
    back to pending, or quarantine an item whose attempts are spent."""

    name, what = "revoke", "revoking expired leases"

    def __init__(self, engine: Engine, specs: Mapping[str, LaneSpec]) -> None:
        super().__init__()
        self.engine, self.specs = engine, specs

    def run_once(self) -> Mapping[str, int]:
        revoked, quarantined = revoke_expired(self.engine, self.specs)
        return {"revoked": revoked, "quarantined": quarantined}


class SettleOrphans(Service):
    """Settle the intents of stopped items (``store.intents.settle_orphans``)."""

    name, what = "settle", "settling the intents of stopped items"

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    def run_once(self) -> Mapping[str, int]:
        return {"settled": settle_orphans(self.engine)}


class RemoveStrayStaged(Service):
    """Every ``interval`` seconds, remove staged files no live intent owns, older than ``grace``
    seconds (``store.intents.sweep_stray_staged``)."""

    name, what = "strays", "removing stray staged files"

    def __init__(self, engine: Engine, *, grace: float = 300.0, interval: float = 60.0) -> None:
        super().__init__()
        self.engine, self.grace, self.interval = engine, grace, interval

    def run_once(self) -> Mapping[str, int]:
        return {"strays": len(sweep_stray_staged(self.engine, self.grace))}


class Republish(Service):
    """Re-publish the messages of items queued more than ``after`` seconds ago whose message no
    live worker holds (``store.dispatch.stale_queued``, ``mark_republished``)."""

    name, what = "republish", "re-publishing lost messages"

    def __init__(self, engine: Engine, publisher: Publisher, *, after: float = 2.0) -> None:
        super().__init__()
        self.engine, self.publisher, self.after = engine, publisher, after

    def run_once(self) -> Mapping[str, int]:
        stale = stale_queued(self.engine, self.after)
        held = self.publisher.held(stale) if stale else set()
        lost = [p for p in stale if p.message_id not in held]
        again = mark_republished(self.engine, lost, "message not in Redis")
        self.publisher.publish(again)
        return {"republished": len(again)}


class DispatchLane(Service):
    """Top up one lane's queue (``store.dispatch.take_for_dispatch``), one service per lane so one
    lane's failure does not stop another's dispatch."""

    def __init__(self, engine: Engine, spec: LaneSpec, publisher: Publisher) -> None:
        super().__init__()
        self.engine, self.spec, self.publisher = engine, spec, publisher
        self.name, self.what = f"dispatch {spec.name}", f"dispatching lane {spec.name}"

    def run_once(self) -> Mapping[str, int]:
        batch = take_for_dispatch(self.engine, self.spec)
        self.publisher.publish(batch)
        return {"dispatched": len(batch)}


class NumberEvents(Service):
    """Number the events outbox (``store.events.assign_cursors``)."""

    name, what = "events", "numbering events"

    def __init__(self, engine: Engine) -> None:
        super().__init__()
        self.engine = engine

    def run_once(self) -> Mapping[str, int]:
        return {"sequenced": assign_cursors(self.engine)}


class ForgetWorkers(Service):
    """Forget registered workers not heard from for ``after`` seconds (``store.workers.forget_stale``)."""

    name, what = "workers", "forgetting dead workers"

    def __init__(self, engine: Engine, *, after: float = FORGET_AFTER) -> None:
        super().__init__()
        self.engine, self.after = engine, after

    def run_once(self) -> Mapping[str, int]:
        return {"workers_forgotten": forget_stale(self.engine, self.after)}


class EndAbandonedSubmissions(Service):
    """Every minute, end the submissions whose submitter died: no chunk for ``after`` seconds
    (``store.submission.end_abandoned_submissions``: the job is cancelled, never left submitting)."""

    name, what = "submissions", "ending abandoned submissions"

    def __init__(self, engine: Engine, *, after: float = SUBMIT_ABANDONED, interval: float = 60.0) -> None:
        super().__init__()
        self.engine, self.after, self.interval = engine, after, interval

    def run_once(self) -> Mapping[str, int]:
        return {"submissions_ended": end_abandoned_submissions(self.engine, self.after)}


class ForgetIdempotencyKeys(Service):
    """Every ``interval`` seconds, delete the idempotency keys older than ``keep``
    (``PHOTOJOBS_IDEMPOTENCY_KEEP``; ``store.idempotency.prune_keys``)."""

    name, what = "keys", "forgetting old idempotency keys"

    def __init__(self, engine: Engine, *, keep: float = IDEMPOTENCY_KEEP, interval: float = 600.0) -> None:
        super().__init__()
        self.engine, self.keep, self.interval = engine, keep, interval

    def run_once(self) -> Mapping[str, int]:
        return {"keys_forgotten": prune_keys(self.engine, self.keep)}


class VacuumTables(Service):
    """Every ``interval`` seconds, on PostgreSQL, vacuum the hot tables autovacuum leaves alone
    whose dead rows passed its threshold (``store.vacuum``). The vacuums run one table after another
    in a thread of their own, so a pass -- the lanes' dispatch -- never waits for one (a million
    items' table takes ~10 s); a check while they run starts nothing. ``vacuumed`` counts the
    tables a finished thread vacuumed since the last check; ``last`` holds (table, seconds) of the
    latest ones (``None``: another sweeper held the table's lock)."""

    name, what = "vacuum", "vacuuming the hot tables"

    def __init__(self, engine: Engine, *, interval: float = 15.0) -> None:
        super().__init__()
        self.engine, self.interval = engine, interval
        self.last: list[tuple[str, float | None]] = []
        self._thread: threading.Thread | None = None
        self._done: list[tuple[str, float | None]] = []
        self._lock = threading.Lock()

    def run_once(self) -> Mapping[str, int]:
        with self._lock:
            finished, self._done = self._done, []
        vacuumed = {"vacuumed": sum(1 for _, took in finished if took is not None)}
        if self._thread is not None and self._thread.is_alive():
            return vacuumed
        due = tables_due(self.engine)
        if due:
            self._thread = threading.Thread(
                target=self._vacuum, args=([d.table for d in due],), name="photojobs-vacuum", daemon=True
            )
            self._thread.start()
        return vacuumed

    def wait_idle(self, timeout: float) -> bool:
        """Whether the vacuum thread (if any) ended within ``timeout`` seconds (tests, shutdown)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
            return not thread.is_alive()
        return True

    def _vacuum(self, tables: list[str]) -> None:
        for table in tables:
            try:
                took = vacuum_table(self.engine, table)
            except Exception:  # noqa: BLE001 - logged; the next check tries again
                log.exception("vacuuming %s failed", table)
                continue
            if took is not None:
                log.info("vacuumed %s in %.1f s (the server's autovacuum is off for it)", table, took)
            with self._lock:
                self._done.append((table, took))
                self.last = [*self.last[-9:], (table, took)]


def default_services(
    engine: Engine,
    specs: Mapping[str, LaneSpec],
    publisher: Publisher,
    *,
    republish_after: float = 2.0,
    stray_grace: float = 300.0,
    stray_every: float = 60.0,
    forget_workers_after: float = FORGET_AFTER,
    submit_abandoned_after: float = SUBMIT_ABANDONED,
    vacuum_every: float = 15.0,
    idempotency_keep: float = IDEMPOTENCY_KEEP,
) -> list[Service]:
    """The sweeper's services in pass order: revoke, settle, strays, republish, one dispatch per
    lane, events, workers, abandoned submissions, old idempotency keys, vacuum (left out when
    ``vacuum_every`` is 0)."""
    return [
        RevokeExpired(engine, specs),
        SettleOrphans(engine),
        RemoveStrayStaged(engine, grace=stray_grace, interval=stray_every),
        Republish(engine, publisher, after=republish_after),
        *(DispatchLane(engine, spec, publisher) for spec in specs.values()),
        NumberEvents(engine),
        ForgetWorkers(engine, after=forget_workers_after),
        EndAbandonedSubmissions(engine, after=submit_abandoned_after),
        ForgetIdempotencyKeys(engine, keep=idempotency_keep),
        *([VacuumTables(engine, interval=vacuum_every)] if vacuum_every > 0 else []),
    ]


def sweep_once(
    engine: Engine,
    specs: Mapping[str, LaneSpec],
    publisher: Publisher,
    *,
    republish_after: float = 2.0,
    stray_grace: float = 300.0,
    forget_workers_after: float = FORGET_AFTER,
) -> SweepReport:
    """One pass of fresh services, every duty included (the stray-file sweep too: a fresh service
    is due). A long-lived sweeper keeps one :class:`Maintenance` and calls ``run_pass``."""
    return Maintenance(
        default_services(
            engine,
            specs,
            publisher,
            republish_after=republish_after,
            stray_grace=stray_grace,
            forget_workers_after=forget_workers_after,
        )
    ).run_pass()
