"""The doorbell: a publish wakes the idle consumers of its queue at once, instead of at their next poll.

Dramatiq's Redis consumers poll: an idle one looks at Redis with a backoff up to
``dramatiq_worker_timeout`` (250 ms under ``photojobs worker``), every lane, every process, busy or
not — most of an idle fleet's CPU, and up to 250 ms before a published item is picked up. Every
photojobs publish (``RedisPublisher.publish``: the dispatcher, the top-up, the sweeper) also
``PUBLISH``es the queue's name on ``CHANNEL``; each worker process holds one subscription (one
thread, blocked on its socket), which sets the events of that queue's consumers. The consumers
(``photojobs.broker``) wait on their event instead of sleeping, so they can poll
``POLL_FACTOR`` times less often while the subscription is up; Redis polls remain the fallback for
what rings no bell (a message enqueued by plain Dramatiq, Dramatiq's requeue of a dead worker's
acks) and for a subscription that is down (back to the normal timeout until it is up again).

The sweepers have a doorbell of their own (``SWEEP_CHANNEL``): a client that submits, resumes or
retries a job rings it (``ring_sweepers``), so the job's first items are dispatched at once instead
of at the next sweep pass (up to ``PHOTOJOBS_SWEEP_INTERVAL``, 1 s by default: 0.42 s from the
commit to the first dispatch, ~11 % of a 300-photo analysis job, before). The interval remains the
fallback.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import redis

log = logging.getLogger("photojobs.doorbell")

CHANNEL = "dramatiq:photojobs.doorbell"
SWEEP_CHANNEL = "dramatiq:photojobs.sweep"  # the sweepers' doorbell; its one "queue" is SWEEP
SWEEP = "sweep"
RING_TIMEOUT = 0.5  # seconds a client waits for Redis when it rings the sweepers
POLL_FACTOR = 4  # an idle lane consumer's longest wait while the doorbell is up: 4 x worker_timeout
RECONNECT_MAX = 2.0  # seconds between attempts to subscribe again after Redis went away


class Doorbell:
    """One subscription per worker process (per broker); ``register(queue)`` gives a consumer its event."""

    def __init__(
        self, client_factory: Callable[[], Any], channel: str = CHANNEL, *, ring_on_change: bool = True
    ) -> None:
        self._client_factory = client_factory
        self.channel = channel
        # Ring every event when the subscription comes or goes (consumers then poll at once and
        # pick their timeout again); the sweepers' bell does not: their interval covers a missed ring.
        self.ring_on_change = ring_on_change
        self._events: dict[str, list[threading.Event]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()
        self._pubsub: Any = None
        self.listening = False  # subscribed right now: consumers may wait longer between polls
        self.rings = 0
        self.subscriptions = 0  # successful subscribes: 1 + the times it came back after losing Redis

    def register(self, queue: str) -> threading.Event:
        event = threading.Event()
        with self._lock:
            self._events.setdefault(queue, []).append(event)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="photojobs-doorbell", daemon=True)
                self._thread.start()
        return event

    def unregister(self, queue: str, event: threading.Event) -> None:
        with self._lock:
            events = self._events.get(queue, [])
            if event in events:
                events.remove(event)

    def ring(self, queue: str) -> None:
        """Wake this process's consumers of ``queue`` (a message for it was published)."""
        self.rings += 1
        for event in self._events.get(queue, ()):
            event.set()

    def _ring_all(self) -> None:
        with self._lock:
            events = [e for es in self._events.values() for e in es]
        for event in events:
            event.set()

    def stop(self) -> None:
        self._stopped.set()
        pubsub = self._pubsub
        if pubsub is not None:
            try:
                pubsub.close()
            except Exception:  # noqa: S110, BLE001 - closing on the way out
                pass

    def _run(self) -> None:
        delay = 0.05
        while not self._stopped.is_set():
            try:
                self._pubsub = self._client_factory().pubsub(ignore_subscribe_messages=True)
                self._pubsub.subscribe(self.channel)
                self.listening = True
                self.subscriptions += 1
                delay = 0.05
                if self.ring_on_change:
                    self._ring_all()  # rings may have been missed while it was down: every consumer looks
                for message in self._pubsub.listen():
                    if self._stopped.is_set():
                        break
                    if message.get("type") == "message":
                        data = message["data"]
                        self.ring(data.decode() if isinstance(data, bytes) else str(data))
            except Exception as exc:  # noqa: BLE001 - Redis went away: poll until it is back
                if self._stopped.is_set():
                    break
                log.debug("doorbell subscription lost (%s); polling until it is back", exc)
            finally:
                self.listening = False
                if self.ring_on_change:
                    self._ring_all()  # back to polling at the normal timeout now, not after a long wait
            self._stopped.wait(delay)
            delay = min(RECONNECT_MAX, delay * 2)


def ring_sweepers(redis_url: str, *, timeout: float = RING_TIMEOUT) -> bool:
    """Ask every running sweeper for a pass now (a job was submitted, resumed or retried): one ``PUBLISH`` on
    ``SWEEP_CHANNEL``. False, logged at debug level, when Redis cannot be reached within ``timeout``:
    the job is in the store all the same, and the sweepers dispatch it at their next pass."""
    try:
        client = redis.Redis.from_url(redis_url, socket_connect_timeout=timeout, socket_timeout=timeout)
        try:
            client.publish(SWEEP_CHANNEL, SWEEP)
        finally:
            client.close()
    except (redis.RedisError, OSError) as exc:
        log.debug("could not ring the sweepers (%s); they dispatch at their next pass", exc)
        return False
    return True
