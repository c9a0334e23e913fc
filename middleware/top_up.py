"""The lane top-up after a finish: refill the lane and the job's next one before the sweeper would."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import dramatiq
from sqlalchemy import Engine

from store.dispatch import take_for_dispatch
from store.lanes import LaneSpec

from .context import ItemContext

log = logging.getLogger("photojobs.lease")


class TopUp:
    """Dispatches a lane's ready items after a finish, when its Redis queue has room for a good batch."""

    def __init__(
        self,
        specs: dict[str, LaneSpec],
        engine: Callable[[], Engine],
        publisher_factory: Callable[[dramatiq.Broker], Any] | None,
    ) -> None:
        self.specs = specs
        self.engine = engine  # the lease middleware's engine, read when needed (it is made at boot)
        self.publisher_factory = publisher_factory
        self._publisher: Any = None
        self._skip: dict[str, int] = {}  # lane -> top-ups to skip before asking Redis again

    def __call__(self, broker: dramatiq.Broker, ctx: ItemContext) -> None:
        """Refill this lane (and the next one of the job) so workers don't wait for the sweeper."""
        if self.publisher_factory is None:
            return
        try:
            if self._publisher is None:
                self._publisher = self.publisher_factory(broker)
            lanes = [ctx.spec]
            job_lanes = ctx.lease.job_lanes
            if ctx.spec.name in job_lanes:
                nxt = job_lanes.index(ctx.spec.name) + 1
                if nxt < len(job_lanes) and job_lanes[nxt] in self.specs:
                    lanes.append(self.specs[job_lanes[nxt]])
            for spec in lanes:
                # A cheap look at Redis first: the dispatcher transaction is only worth it when the
                # lane's queue has room for a good batch (otherwise the sweeper keeps it topped up).
                # A queue found L long cannot fall to half the bound before L - bound/2 more items
                # are taken from it, this process's share of which (1 / fleet processes) it skips
                # asking again: one Redis round trip per batch instead of one per item.
                if self._skip.get(spec.name, 0) > 0:
                    self._skip[spec.name] -= 1
                    continue
                length, half = self._publisher.queue_length(spec.name), spec.effective_bound // 2
                if length > half:
                    self._skip[spec.name] = (length - half) // max(1, spec.fleet_processes)
                    continue
                self._publisher.publish(take_for_dispatch(self.engine(), spec))
        except Exception:  # noqa: BLE001 - the sweeper tops up too
            log.warning("top-up after item %s failed; the sweeper will dispatch", ctx.item_id, exc_info=True)
