"""The Dramatiq side: the broker (with our middleware, without Dramatiq's Retries) and the publisher.

Messages name ``[item_id, token]``. Their Redis id is deterministic (``pj-<item>-<token>``) so the
sweeper can ask Redis whether a queued item's message is still waiting in its queue.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable

import dramatiq
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from dramatiq.errors import DecodeError
from dramatiq.message import Message
from dramatiq.middleware import CurrentMessage, TimeLimit

from store.dispatch import Publish
from store.lanes import LaneSpec, all_lanes

NAMESPACE = "dramatiq"
PREFETCHED_GRACE = 10.0
log = logging.getLogger("photojobs.broker")


class _TolerantConsumer(_RedisConsumer):
    """Dramatiq's Redis consumer, but an undecodable message is acknowledged and reported
    instead of crashing the consumer (which would strand it in the worker's ack set)."""

    def __next__(self):  # type: ignore[no-untyped-def]
        while True:
            try:
                return super().__next__()
            except DecodeError as exc:
                self._discard(exc)

    def _discard(self, exc: DecodeError) -> None:
        broker: PhotojobsBroker = self.broker
        raw = exc.data if isinstance(exc.data, bytes) else str(exc.data).encode()
        reason = f"malformed message ({exc.error.__class__.__name__}: {str(exc.error)[:120]})"
        key = f"{broker.namespace}:{self.queue_name}.msgs"
        for redis_id, data in broker.client.hscan_iter(key):
            if data == raw:
                broker.do_ack(self.queue_name, redis_id.decode())
                break
        log.warning("rejected a message on %s: %s: %r", self.queue_name, reason, raw[:100])
        if broker.on_rejected is not None:
            broker.on_rejected(self.queue_name, None, reason, raw[:200].decode(errors="replace"))


class PhotojobsBroker(RedisBroker):
    """RedisBroker with a consumer that survives malformed messages."""

    on_rejected: Callable[[str, str | None, str, str], None] | None = None

    @property
    def consumer_class(self):  # type: ignore[no-untyped-def]
        return _TolerantConsumer


def build_broker(redis_url: str, middleware: Iterable[dramatiq.Middleware] = ()) -> PhotojobsBroker:
    """A RedisBroker whose retries and leases are the store's business, not Dramatiq's."""
    broker = PhotojobsBroker(
        url=redis_url,
        namespace=NAMESPACE,
        middleware=[TimeLimit(), CurrentMessage(), *middleware],
        heartbeat_timeout=15000,
    )
    return broker


def lane_message(spec: LaneSpec, item_id: int, token: int) -> Message:
    return Message(
        queue_name=spec.queue,
        actor_name=spec.actor,
        args=(item_id, token),
        kwargs={},
        options={"redis_message_id": f"pj-{item_id}-{token}"},
        message_id=str(uuid.uuid4()),
    )


class RedisPublisher:
    """Publishes dispatched items and answers whether Redis still holds an item's message."""

    def __init__(self, broker: RedisBroker, specs: dict[str, LaneSpec] | None = None) -> None:
        self.broker = broker
        self.specs = specs or all_lanes()

    def publish(self, items: list[Publish]) -> None:
        for p in items:
            spec = self.specs[p.lane]
            message = lane_message(spec, p.item_id, p.token)
            reason = spec.message_args_valid(list(message.args), message.kwargs)
            if reason:  # validated on enqueue as well as on receipt
                raise ValueError(f"refusing to publish an invalid {spec.name} message: {reason}")
            self.broker.do_enqueue(spec.queue, p.message_id, message.encode())

    def holds(self, item: Publish) -> bool:
        """True while Redis still has the item's message: waiting in its queue, or fetched by a
        worker (prefetched, not yet acknowledged) for less than ``PREFETCHED_GRACE`` seconds. A
        message a dead worker had prefetched is given up after that and published again."""
        spec = self.specs[item.lane]
        key = f"{NAMESPACE}:{spec.queue}"
        if self.broker.client.lpos(key, item.message_id) is not None:
            return True
        fetched = bool(self.broker.client.hexists(f"{key}.msgs", item.message_id))
        return fetched and item.age < PREFETCHED_GRACE

    def queue_length(self, lane: str) -> int:
        return int(self.broker.client.llen(f"{NAMESPACE}:{self.specs[lane].queue}"))
