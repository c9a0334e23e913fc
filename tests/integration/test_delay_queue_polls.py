"""The delay-queue consumers poll Redis ``DELAY_QUEUE_POLL_FACTOR`` times less often than a lane's
own (photojobs never delays a message), and they are still each worker process's Dramatiq heartbeat:
a worker whose threads are all busy and whose prefetch is full counts as live, so its prefetched
message is held, not published again. A real Dramatiq worker on a real Redis."""

from __future__ import annotations

import threading
import time

import dramatiq

from photojobs.broker import DELAY_QUEUE_POLL_FACTOR, LIVE_WITHIN, NAMESPACE, RedisPublisher, build_broker
from store.dispatch import Publish
from store.lanes import all_lanes


def test_a_delay_queue_consumer_polls_less_often_than_its_lane_queue(redis_url: str) -> None:
    # Given the product's broker
    broker = build_broker(redis_url)
    # When consumers are made for a lane's queue and for its delay queue with a 250 ms idle timeout
    lane = broker.consume("photojobs.noop", prefetch=2, timeout=250)
    delayed = broker.consume("photojobs.noop.DQ", prefetch=2, timeout=250)
    # Then the lane's keeps the timeout and the delay queue's polls DELAY_QUEUE_POLL_FACTOR times less
    assert lane.timeout == 250  # type: ignore[attr-defined]
    assert delayed.timeout == 250 * DELAY_QUEUE_POLL_FACTOR  # type: ignore[attr-defined]
    assert 250 * DELAY_QUEUE_POLL_FACTOR / 1000 < LIVE_WITHIN / 2  # a beat at least twice per LIVE_WITHIN


def test_a_busy_worker_with_a_full_prefetch_keeps_beating_and_its_prefetched_message_is_held(
    redis_url: str,
) -> None:
    # Given a Dramatiq worker with one thread and a prefetch of two on the noop lane's queue, whose
    # actor blocks until released, and two published messages: one running, one prefetched
    specs = all_lanes({})
    queue = specs["noop"].queue
    broker = build_broker(redis_url)
    started, release = threading.Event(), threading.Event()

    def lane_noop(item_id: int, token: int) -> None:
        started.set()
        release.wait(30)

    dramatiq.actor(lane_noop, actor_name=specs["noop"].actor, queue_name=queue, broker=broker)
    publisher = RedisPublisher(build_broker(redis_url), specs)
    items = [Publish(1, 1, "noop", age=1.0), Publish(2, 1, "noop", age=1.0)]
    publisher.publish(items)
    worker = dramatiq.Worker(broker, queues={queue}, worker_threads=1, worker_timeout=250)
    worker.queue_prefetch = 2
    worker.start()
    client = publisher.broker.client
    beats = f"{NAMESPACE}:__heartbeats__"
    try:
        assert started.wait(10), "the worker never started the first message"
        deadline = time.monotonic() + 10
        while client.llen(f"{NAMESPACE}:{queue}") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.llen(f"{NAMESPACE}:{queue}") == 0, "the second message was never prefetched"
        # When it stays busy for longer than LIVE_WITHIN after its consumers' idle backoff reached
        # its cap (a few seconds), the lane's consumer fetching nothing
        first_beat = client.zscore(beats, broker.broker_id)
        seen: set[float] = set()
        busy_until = time.monotonic() + 3 + LIVE_WITHIN + 1
        while time.monotonic() < busy_until:
            score = client.zscore(beats, broker.broker_id)
            assert score is not None
            # at least every DELAY_QUEUE_POLL_FACTOR x 250 ms = 1 s: never near LIVE_WITHIN (5 s)
            assert time.time() * 1000 - score < LIVE_WITHIN * 1000 / 2, "the busy worker stopped beating"
            seen.add(score)
            time.sleep(0.1)
        # Then it beat all along (its delay-queue consumers' polls), so its prefetched message is
        # held by a live worker and the sweeper would not publish it again
        assert first_beat is not None and len(seen) >= 3
        assert publisher.held(items) == {"pj-1-1", "pj-2-1"}
    finally:
        release.set()
        worker.stop(timeout=10_000)
