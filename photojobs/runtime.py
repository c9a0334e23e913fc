"""Wiring for worker processes: the broker with the lease middleware, engines and publishers."""

from __future__ import annotations

import functools
import logging

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from sqlalchemy import Engine

from middleware.heartbeat import check_heartbeat
from middleware.lease import LeaseMiddleware
from middleware.locks import LockMiddleware
from photojobs.broker import RedisPublisher, build_broker
from photojobs.config import Settings
from photojobs.quiet import install as quiet_logging
from store.engine import make_engine
from store.lanes import all_lanes

log = logging.getLogger("photojobs")


@functools.cache
def engine_for(url: str) -> Engine:
    """A worker process's engine: it holds leases (a frozen worker's idle transaction ends within
    the lease TTL: ``store.engine.make_engine(lease_holder=True)``)."""
    return make_engine(url, lease_holder=True)


def setup_worker_broker(settings: Settings | None = None) -> RedisBroker:
    """The broker ``dramatiq actors`` runs with; set as Dramatiq's global broker."""
    settings = settings or Settings.from_env()
    quiet_logging()
    specs = all_lanes(settings.env)
    check_heartbeat(specs, settings.heartbeat_explicit, settings.env)
    locks = LockMiddleware(specs)
    lease = LeaseMiddleware(
        specs,
        engine_factory=lambda: engine_for(settings.database_url),
        heartbeat_interval=settings.heartbeat_explicit,
        publisher_factory=lambda broker: RedisPublisher(broker, specs),
        locks=locks,
        chain_claims=settings.chain_claims,
    )
    broker = build_broker(settings.redis_url, [locks, lease])
    dramatiq.set_broker(broker)
    return broker
