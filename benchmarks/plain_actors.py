"""The plain-Dramatiq baseline: a no-op actor on its own queue, with Dramatiq's default middleware.

Run by ``dramatiq benchmarks.plain_actors --processes P --threads T --queues pjbench.plain`` with
``PJBENCH_REDIS_URL`` set. Each message ``(run, total)`` increments the Redis counter of its run and
stamps the first and the ``total``-th completion times, so the benchmark sees when the last one ended.
"""

from __future__ import annotations

import os
import time

import dramatiq
from dramatiq.brokers.redis import RedisBroker

QUEUE = "pjbench.plain"
ACTOR = "pjbench_noop"


def redis_url() -> str:
    """The Redis of the benchmark run (``PJBENCH_REDIS_URL``, else photojobs' or the local default)."""
    return (
        os.environ.get("PJBENCH_REDIS_URL")
        or os.environ.get("PHOTOJOBS_REDIS_URL")
        or "redis://127.0.0.1:6379/0"
    )


def keys(run: str) -> tuple[str, str, str]:
    """Redis keys of a run: (completion counter, first completion time, last completion time)."""
    return f"pjbench:{run}:count", f"pjbench:{run}:first", f"pjbench:{run}:last"


def noop(run: str, total: int) -> None:
    """Count one completion of ``run``; the first and the ``total``-th stamp their time."""
    client = dramatiq.get_broker().client  # type: ignore[attr-defined]
    count, first, last = keys(run)
    n = client.incr(count)
    if n == 1:
        client.set(first, repr(time.time()))
    if n == total:
        client.set(last, repr(time.time()))


def declare(broker: RedisBroker) -> dramatiq.Actor:
    """The baseline actor on ``broker`` (the benchmark declares it on its own broker to send)."""
    return dramatiq.actor(noop, broker=broker, actor_name=ACTOR, queue_name=QUEUE, max_retries=0)


broker = RedisBroker(url=redis_url())
dramatiq.set_broker(broker)
bench_noop = declare(broker)
