"""The doorbell (``photojobs.doorbell``): a publish wakes the idle consumers of its queue at once. A
real Dramatiq worker on a real Redis, whose consumer has backed off to a minute between polls."""

from __future__ import annotations

import threading
import time
from typing import Any

import dramatiq
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from photojobs.broker import RedisPublisher, build_broker
from photojobs.doorbell import CHANNEL, Doorbell
from store.dispatch import Publish
from store.lanes import all_lanes
from tests.support import poll

LONG_POLL_MS = 60_000  # without the doorbell, the consumer would look at Redis again in 30-60 s


def _noop_worker(redis_url: str) -> tuple[dramatiq.Broker, dramatiq.Worker, threading.Event]:
    """The product's broker and a started one-thread Dramatiq worker on the noop lane whose idle
    consumer may wait up to ``LONG_POLL_MS`` between polls; the event is set when a message ran."""
    specs = all_lanes({})
    queue = specs["noop"].queue
    broker = build_broker(redis_url)
    ran = threading.Event()

    def lane_noop(item_id: int, token: int) -> None:
        ran.set()

    dramatiq.actor(lane_noop, actor_name=specs["noop"].actor, queue_name=queue, broker=broker)
    worker = dramatiq.Worker(broker, queues={queue}, worker_threads=1, worker_timeout=LONG_POLL_MS)
    worker.start()
    return broker, worker, ran


LONG_WAIT_S = 5.0  # a bell wait at least this long is the backed-off consumer's long wait


def _long_wait_entered(consumer: Any) -> threading.Event:
    """An event set when ``consumer`` (the product's doorbell consumer) next calls its bell's
    ``wait`` with a timeout of ``LONG_WAIT_S`` or more: it has polled Redis, found nothing and
    begins its backed-off wait (a ring before the wait itself starts still wakes it: the bell is
    an ``Event``)."""
    entered = threading.Event()
    bell = consumer._bell
    original = bell.wait

    def wait(timeout: float | None = None) -> bool:
        if timeout is None or timeout >= LONG_WAIT_S:
            entered.set()
        return bool(original(timeout))

    bell.wait = wait
    return entered


def _stop(worker: dramatiq.Worker, broker: dramatiq.Broker) -> None:
    """Stop the worker without waiting out its consumer's minute-long wait: mark its consumer
    threads stopped, then ring every bell so they see it now."""
    for thread in worker.consumers.values():
        thread.running = False
    broker.doorbell._ring_all()  # type: ignore[attr-defined]
    worker.stop(timeout=10_000)
    broker.close()


def test_a_published_message_wakes_a_consumer_that_backed_off_to_a_minute(redis_url: str) -> None:
    # Given a worker on the noop lane whose idle consumer waits up to a minute between Redis polls
    # (its backoff already at the cap) and whose doorbell is subscribed
    specs = all_lanes({})
    queue = specs["noop"].queue
    broker, worker, ran = _noop_worker(redis_url)
    try:
        assert poll(lambda: queue in worker.consumers and worker.consumers[queue].consumer, 10)
        consumer = worker.consumers[queue].consumer
        entered = _long_wait_entered(consumer)
        consumer.misses = 30  # type: ignore[union-attr]  # the next idle wait is the longest
        assert poll(lambda: broker.doorbell.listening, 10), "the doorbell never subscribed"
        rings = broker.doorbell.rings
        # (the condition under test: the consumer has entered its long wait)
        assert entered.wait(10), "the consumer never entered its long wait"
        # When an item is published through the product's publisher
        RedisPublisher(build_broker(redis_url), specs).publish([Publish(1, 1, "noop")])
        # Then the doorbell rang and the consumer fetched and ran it well before its next poll
        assert poll(ran.is_set, 10), "the published message waited for the consumer's next poll"
        assert broker.doorbell.rings > rings
    finally:
        _stop(worker, broker)


def test_a_doorbell_whose_redis_is_unreachable_is_not_listening_and_rings_nothing(redis_url: str) -> None:
    # Given a doorbell whose Redis refuses connections, with one registered consumer event
    # (redis-py retries a refused connection with backoff, ~4.7 s an attempt; retries off here so an
    # attempt is one refused connect, and the polls below allow for a loaded machine)
    bell = Doorbell(
        lambda: redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    )
    event = bell.register("photojobs.noop")
    try:
        # When it tries to subscribe
        assert poll(event.is_set, 30)  # every failed attempt wakes the consumers to poll
        # Then it is not listening (consumers poll at their normal timeout), and keeps trying
        assert not bell.listening
        event.clear()
        assert poll(event.is_set, 30)
        assert not bell.listening
    finally:
        bell.stop()


def test_publish_rings_each_queue_once_in_the_same_round_trip(redis_url: str) -> None:
    # Given a subscriber on the doorbell channel and the product's publisher
    specs = all_lanes({})
    client = redis.Redis.from_url(redis_url)
    sub = client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe(CHANNEL)
    assert poll(lambda: client.pubsub_numsub(CHANNEL)[0][1] >= 1, 5)
    # When three noop items and one exif item are published
    RedisPublisher(build_broker(redis_url), specs).publish(
        [Publish(1, 1, "noop"), Publish(2, 1, "noop"), Publish(3, 1, "exif"), Publish(4, 1, "noop")]
    )
    # Then each queue's bell rang once
    got: list[str] = []
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(got) < 2:
        m = sub.get_message(timeout=0.2)
        if m and m["type"] == "message":
            got.append(m["data"].decode())
    assert sorted(got) == sorted([specs["noop"].queue, specs["exif"].queue])
    sub.close()


def test_a_closed_consumer_is_no_longer_rung(redis_url: str) -> None:
    # Given the product's broker and two consumers of the noop queue, as Dramatiq makes a new one
    # after each connection error, and one of its delay queue
    broker = build_broker(redis_url)
    first = broker.consume("photojobs.noop", prefetch=2, timeout=250)
    second = broker.consume("photojobs.noop", prefetch=2, timeout=250)
    broker.consume("photojobs.noop.DQ", prefetch=2, timeout=250)
    try:
        assert len(broker.doorbell._events["photojobs.noop"]) == 2
        assert "photojobs.noop.DQ" not in broker.doorbell._events  # delay queues get no doorbell
        # When the first is closed
        first.close()
        # Then only the second's event is left to ring
        assert broker.doorbell._events["photojobs.noop"] == [second._bell]  # type: ignore[attr-defined]
    finally:
        broker.close()


def test_a_doorbell_whose_subscription_is_killed_subscribes_again_and_rings_again(redis_url: str) -> None:
    # Given a worker on the noop lane whose idle consumer waits up to a minute between polls, with
    # its doorbell subscribed
    specs = all_lanes({})
    queue = specs["noop"].queue
    broker, worker, ran = _noop_worker(redis_url)
    admin = redis.Redis.from_url(redis_url)
    try:
        bell = broker.doorbell
        assert poll(lambda: queue in worker.consumers and worker.consumers[queue].consumer, 10)
        assert poll(lambda: bell.listening and bell._pubsub.connection is not None, 10)
        assert bell.subscriptions == 1
        # When Redis drops exactly the doorbell's connection (CLIENT KILL by its address)
        host, port = bell._pubsub.connection._sock.getsockname()[:2]
        assert admin.execute_command("CLIENT", "KILL", "ADDR", f"{host}:{port}")
        # Then it subscribes again on its own
        assert poll(lambda: bell.subscriptions >= 2 and bell.listening, 10), "the doorbell did not come back"
        # And a message published afterwards still wakes the consumer backed off to a minute
        consumer = worker.consumers[queue].consumer
        entered = _long_wait_entered(consumer)
        consumer.misses = 30  # type: ignore[union-attr]
        # (the condition under test: the consumer has entered its long wait)
        assert entered.wait(10), "the consumer never entered its long wait"
        RedisPublisher(build_broker(redis_url), specs).publish([Publish(1, 1, "noop")])
        assert poll(ran.is_set, 10), "after the reconnection the message waited for the next poll"
    finally:
        _stop(worker, broker)
