"""The Dramatiq side: the broker (with our middleware, without Dramatiq's Retries) and the publisher.

Messages name ``[item_id, token]``. Their Redis id is deterministic (``pj-<item>-<token>``) so the
sweeper can ask Redis whether a queued item's message is still waiting in its queue or prefetched by
a live worker (``RedisPublisher.held``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import dq_name
from dramatiq.errors import DecodeError
from dramatiq.message import Message
from dramatiq.middleware import CurrentMessage, TimeLimit

from middleware.dramatiq_compat import ConsumerBase, ack_undecodable, enqueue_args
from store.dispatch import Publish, batch_message_id, items_of_message_id, message_groups, stranded_after
from store.lanes import LaneSpec, all_lanes

from .doorbell import CHANNEL, POLL_FACTOR, Doorbell

NAMESPACE = "dramatiq"
HEARTBEAT_TIMEOUT_MS = 15000
# A worker process counts as alive while its last Dramatiq heartbeat is this recent. Every process
# beats at least once per idle poll of its delay-queue consumers (``DELAY_QUEUE_POLL_FACTOR`` ×
# ``dramatiq_worker_timeout``: 1 s under ``photojobs worker``/``run``), busy or not, so 5 s is 5
# missed polls: a process that silent is dead or frozen. Well under the broker's heartbeat timeout
# (after which Dramatiq itself would requeue its acks, at random) and under the default lease TTL
# (10 s), so a dead worker's prefetched items come back no later than the one it was running. A live
# process judged dead (a clock skewed by more than this, a stall) only costs a duplicate message,
# which the item's token turns away.
LIVE_WITHIN = 5.0
# photojobs never delays a message (a retry waits in the store, ``not_before``), so a lane's delay
# queue only ever holds a foreign message: its consumer polls this many times less often than the
# lane's own (at 250 ms, the 6 delay-queue consumers of a process were ~1.4 % of a core, idle or busy).
DELAY_QUEUE_POLL_FACTOR = 4
log = logging.getLogger("photojobs.broker")


class _TolerantConsumer(ConsumerBase):
    """Dramatiq's Redis consumer (``middleware.dramatiq_compat.ConsumerBase``), but an undecodable
    message is acknowledged and reported instead of crashing the consumer (which would strand it in
    the worker's ack set); and an idle lane consumer waits on the process's doorbell
    (``photojobs.doorbell``) instead of sleeping, so a publish wakes it at once and, while the
    doorbell is up, it polls ``POLL_FACTOR`` times less often."""

    def __init__(self, broker, queue_name, prefetch, timeout):  # type: ignore[no-untyped-def]
        delayed = queue_name == dq_name(queue_name)
        if delayed:  # no doorbell rings for it: it polls DELAY_QUEUE_POLL_FACTOR times less often
            timeout *= DELAY_QUEUE_POLL_FACTOR
        super().__init__(broker, queue_name, prefetch, timeout)
        self._doorbell: Doorbell | None = None if delayed else getattr(broker, "doorbell", None)
        self._bell = self._doorbell.register(queue_name) if self._doorbell is not None else None
        self._quiet_until = 0.0  # monotonic time of the next Redis poll while the doorbell is up

    def close(self) -> None:
        """Dramatiq makes a new consumer after each connection error: this one stops being rung."""
        if self._doorbell is not None and self._bell is not None:
            self._doorbell.unregister(self.queue_name, self._bell)
        super().close()

    # The idle wait: on the doorbell's event (cleared before the fetch, so a publish after it is
    # not missed) instead of Dramatiq's ``time.sleep``.
    def between_polls(self) -> bool:
        bell = self._bell
        if bell is not None and not bell.is_set() and time.monotonic() < self._quiet_until:
            # Between two polls: back to the consumer thread at least every timeout, so it
            # acknowledges and stops on time, without asking Redis.
            bell.wait(min(self.timeout / 1000, self._quiet_until - time.monotonic()))
            return True
        return False

    def before_fetch(self) -> None:
        if self._bell is not None:
            self._bell.clear()

    def longest_backoff(self) -> float:
        longest = self.timeout
        if self._bell is not None and self._doorbell is not None and self._doorbell.listening:
            longest *= POLL_FACTOR
        return longest

    def idle(self, backoff_ms: float) -> None:
        bell = self._bell
        if bell is None:
            time.sleep(backoff_ms / 1000)
            return
        self._quiet_until = time.monotonic() + backoff_ms / 1000
        bell.wait(min(self.timeout, backoff_ms) / 1000)

    def on_undecodable(self, exc: DecodeError) -> None:
        broker: PhotojobsBroker = self.broker
        raw = exc.data if isinstance(exc.data, bytes) else str(exc.data).encode()
        reason = f"malformed message ({exc.error.__class__.__name__}: {str(exc.error)[:120]})"
        ack_undecodable(broker, self.queue_name, raw)
        log.warning("rejected a message on %s: %s: %r", self.queue_name, reason, raw[:100])
        if broker.on_rejected is not None:
            broker.on_rejected(self.queue_name, None, reason, raw[:200].decode(errors="replace"))


class PhotojobsBroker(RedisBroker):
    """RedisBroker with a consumer that survives malformed messages and answers the doorbell."""

    on_rejected: Callable[[str, str | None, str, str], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.doorbell = Doorbell(lambda: self.client)

    def close(self) -> None:
        self.doorbell.stop()
        super().close()

    @property
    def consumer_class(self):  # type: ignore[no-untyped-def]
        return _TolerantConsumer


def build_broker(redis_url: str, middleware: Iterable[dramatiq.Middleware] = ()) -> PhotojobsBroker:
    """A RedisBroker whose retries and leases are the store's business, not Dramatiq's."""
    broker = PhotojobsBroker(
        url=redis_url,
        namespace=NAMESPACE,
        middleware=[TimeLimit(), CurrentMessage(), *middleware],
        heartbeat_timeout=HEARTBEAT_TIMEOUT_MS,
    )
    return broker


def lane_message(spec: LaneSpec, item_id: int, token: int, interactive: bool = False) -> Message:
    return batch_message(spec, [Publish(item_id, token, spec.name, interactive=interactive)])


def batch_message(spec: LaneSpec, items: list[Publish]) -> Message:
    """The lane's message naming ``items`` (``[id, token, id, token, …]``), with the deterministic
    Redis id the sweeper asks about (``store.dispatch.batch_message_id``); in the lane's interactive
    queue, for its interactive actor, when the items are interactive (``Publish.interactive``)."""
    queue, actor = spec.route(items[0].interactive)
    return Message(
        queue_name=queue,
        actor_name=actor,
        args=tuple(x for p in items for x in (p.item_id, p.token)),
        kwargs={},
        options={"redis_message_id": batch_message_id(items)},
        message_id=str(uuid.uuid4()),
    )


class RedisPublisher:
    """Publishes dispatched items and answers whether Redis still holds an item's message."""

    def __init__(self, broker: RedisBroker, specs: dict[str, LaneSpec] | None = None) -> None:
        self.broker = broker
        self.specs = specs or all_lanes()
        self._where = broker.client.register_script(_WHERE_LUA)

    def publish(self, items: list[Publish]) -> None:
        """Enqueue the items' messages (one per item, or one per dispatch group: a batch message,
        ``store.dispatch.message_groups``), all in one Redis round trip (a pipeline of Dramatiq's own
        ``enqueue`` script calls, with the arguments ``RedisBroker.do_enqueue`` gives it:
        ``middleware.dramatiq_compat.enqueue_args``), and ring
        each queue's doorbell (``photojobs.doorbell``) in the same round trip."""
        encoded = []
        for group in message_groups(items):
            spec = self.specs[group[0].lane]
            message = batch_message(spec, group)
            reason = spec.message_args_valid(list(message.args), message.kwargs)
            if reason:  # validated on enqueue as well as on receipt
                raise ValueError(f"refusing to publish an invalid {spec.name} message: {reason}")
            encoded.append((message.queue_name, message.options["redis_message_id"], message.encode()))
        if encoded:
            self._enqueue_pipelined(encoded)

    def _enqueue_pipelined(self, encoded: list[tuple[str, str, bytes]]) -> None:
        b = self.broker
        script = b.scripts["dispatch"]
        pipe = b.client.pipeline(transaction=False)
        for i, (queue, message_id, data) in enumerate(encoded):
            args = enqueue_args(b, queue, message_id, data, maintain=i == 0)
            script(keys=[b.namespace], args=args, client=pipe)
        for queue in dict.fromkeys(q for q, _, _ in encoded):
            pipe.publish(CHANNEL, queue)  # the doorbell: wakes the queue's idle consumers now
        pipe.execute()

    def held(self, items: list[Publish]) -> set[str]:
        """The message ids of ``items`` that Redis still holds for someone: waiting in their lane's
        queue (or its delay queue), or fetched (prefetched, not yet acknowledged) by a worker process
        whose Dramatiq heartbeat is less than ``LIVE_WITHIN`` seconds old — in a message of their
        own or in a batch message (whose Redis id names every item it carries). A message only a
        dead worker had fetched is not held: the sweeper publishes it again at once instead of
        waiting for Dramatiq to requeue it (the old copy, if Dramatiq requeues it later, is turned
        away by the item's token). One Lua call, whatever the number of items."""
        if not items:
            return set()
        queues = sorted({q for p in items for q in self.specs[p.lane].queues})
        argv: list[str | int] = [NAMESPACE, int((time.time() - LIVE_WITHIN) * 1000), *queues]
        where: dict[tuple[str, str], int] = {}
        for queue, (waiting, fetched) in zip(queues, self._where(args=argv), strict=True):
            for state, ids in ((FETCHED_BY_LIVE, fetched), (WAITING, waiting)):  # waiting wins
                for message_id in ids:
                    for key in items_of_message_id(message_id.decode()):
                        where[(queue, key)] = state
        out: set[str] = set()
        for p in items:
            # in either queue of the lane: a small job's message takes the lane's own queue while
            # the lane is idle (``store.dispatch``), whatever ``p.interactive`` says now
            w = {where.get((q, p.message_id), NOWHERE) for q in self.specs[p.lane].queues}
            stranded = p.age >= stranded_after(self.specs[p.lane])
            if WAITING in w or (FETCHED_BY_LIVE in w and not stranded):
                out.add(p.message_id)
        return out

    def holds(self, item: Publish) -> bool:
        """``held`` for one item."""
        return item.message_id in self.held([item])

    def queue_length(self, lane: str) -> int:
        return int(self.broker.client.llen(f"{NAMESPACE}:{self.specs[lane].queue}"))


# Where the messages of each queue are (ARGV: the namespace, the oldest live heartbeat in ms, then
# the queues): per queue, the ids WAITING in its list or its delay queue's, and the ids FETCHED by a
# worker whose heartbeat is recent (in its ack set); an id only in a dead worker's ack set, or gone,
# is NOWHERE. A message's data must still be in its queue's hash: an acknowledged message is gone
# even if its id lingers. Both lists are bounded by the lane's bound and the workers' prefetch.
# Key names are Dramatiq's (dramatiq/brokers/redis/dispatch.lua): ``<ns>:<queue>`` (list of ids),
# ``<ns>:<queue>.msgs`` (id -> data), ``<ns>:__acks__.<worker>.<queue>`` (fetched, unacknowledged
# ids) and ``<ns>:__heartbeats__`` (worker -> last beat, ms); the delay queue is ``<queue>.DQ``.
NOWHERE, WAITING, FETCHED_BY_LIVE = 0, 1, 2
_WHERE_LUA = """
local ns = ARGV[1]
local live = redis.call("zrangebyscore", ns .. ":__heartbeats__", ARGV[2], "+inf")
local out = {}
for i = 3, #ARGV do
  local waiting, fetched = {}, {}
  for _, q in ipairs({ARGV[i], ARGV[i] .. ".DQ"}) do
    local msgs = ns .. ":" .. q .. ".msgs"
    for _, id in ipairs(redis.call("lrange", ns .. ":" .. q, 0, -1)) do
      if redis.call("hexists", msgs, id) == 1 then waiting[#waiting + 1] = id end
    end
    for _, w in ipairs(live) do
      for _, id in ipairs(redis.call("smembers", ns .. ":__acks__." .. w .. "." .. q)) do
        if redis.call("hexists", msgs, id) == 1 then fetched[#fetched + 1] = id end
      end
    end
  end
  out[#out + 1] = {waiting, fetched}
end
return out
"""
