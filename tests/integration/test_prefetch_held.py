"""``RedisPublisher.held`` on a real Redis: a message counts as held while it waits in its queue or
sits in the ack set of a live Dramatiq consumer, not when only a dead consumer had fetched it."""

from __future__ import annotations

import time

import redis
from dramatiq.message import Message

from photojobs.broker import LIVE_WITHIN, NAMESPACE, RedisPublisher, build_broker
from store.dispatch import Publish
from store.lanes import all_lanes


def _count_round_trips(client: redis.Redis) -> list[str]:
    """Record the name of every command this client sends (each one a round trip)."""
    sent: list[str] = []
    send = client.execute_command

    def counting(*args, **options):  # type: ignore[no-untyped-def]
        sent.append(str(args[0]))
        return send(*args, **options)

    client.execute_command = counting  # type: ignore[method-assign]
    return sent


def test_held_counts_the_queue_and_live_consumers_not_dead_ones(redis_url: str) -> None:
    # Given six published noop messages, a publisher, and two consumer processes' brokers
    specs = all_lanes({})
    publisher = RedisPublisher(build_broker(redis_url), specs)
    queue = specs["noop"].queue
    items = [Publish(i, 1, "noop", age=3.0) for i in range(1, 7)]
    publisher.publish(items)
    live, dead = build_broker(redis_url), build_broker(redis_url)
    # When the live consumer fetches items 1-2 (its ack set), the dead one items 3-4 and then stops
    # beating (its last heartbeat older than LIVE_WITHIN), item 5 is fetched and acknowledged,
    # item 6 still waits in the queue, and item 7 was never published
    assert len(live.do_fetch(queue, 2)) == 2
    assert len(dead.do_fetch(queue, 2)) == 2
    done = build_broker(redis_url)
    [data] = done.do_fetch(queue, 1)
    done.do_ack(queue, "pj-5-1")
    past = int((time.time() - LIVE_WITHIN - 1) * 1000)
    client = publisher.broker.client
    client.zadd(f"{NAMESPACE}:__heartbeats__", {dead.broker_id: past})
    assert client.sismember(f"{NAMESPACE}:__acks__.{dead.broker_id}.{queue}", "pj-3-1")
    never = Publish(7, 1, "noop", age=3.0)
    # Then the queue's and the live consumer's messages are held, the dead one's, the acknowledged
    # one and the unpublished one are not
    assert publisher.held([*items, never]) == {"pj-1-1", "pj-2-1", "pj-6-1"}
    assert publisher.holds(items[0]) and not publisher.holds(items[2])
    # And once the dead consumer beats again (it was only stalled), its messages are held again
    dead.do_qsize(queue)  # any broker command records a heartbeat
    assert publisher.held(items) == {"pj-1-1", "pj-2-1", "pj-3-1", "pj-4-1", "pj-6-1"}


def test_a_message_stranded_in_a_live_ack_set_is_given_up_after_twice_the_time_limit(
    redis_url: str,
) -> None:
    # Given a message fetched by a live consumer that never acknowledges it, on a lane whose messages
    # carry one item (a batch lane's threshold is tests/integration/test_stranded_batches.py's)
    specs = all_lanes({"PHOTOJOBS_LANE_NOOP_TIME_LIMIT": "5", "PHOTOJOBS_LANE_NOOP_BATCH": "1"})
    publisher = RedisPublisher(build_broker(redis_url), specs)
    publisher.publish([Publish(1, 1, "noop")])
    assert len(build_broker(redis_url).do_fetch(specs["noop"].queue, 1)) == 1
    # When it has been queued for less, and for more, than twice the lane's time limit (5 s)
    young, old = Publish(1, 1, "noop", age=9.0), Publish(1, 1, "noop", age=10.0)
    # Then it is held at first, and given up (published again) after
    assert publisher.held([young]) == {"pj-1-1"}
    assert publisher.held([old]) == set()


def test_held_asks_redis_once_for_any_number_of_items(redis_url: str) -> None:
    # Given 200 published messages, half of them fetched by a live consumer
    specs = all_lanes({})
    publisher = RedisPublisher(build_broker(redis_url), specs)
    items = [Publish(i, 2, "noop", age=3.0) for i in range(1, 201)]
    publisher.publish(items)
    assert len(build_broker(redis_url).do_fetch(specs["noop"].queue, 100)) == 100
    publisher.held(items[:1])  # loads the script
    sent = _count_round_trips(publisher.broker.client)
    # When the sweeper asks about all of them
    held = publisher.held(items)
    # Then every one is held, and it took one round trip to Redis
    assert held == {p.message_id for p in items}
    assert sent == ["EVALSHA"]


def test_publish_sends_a_batch_in_one_round_trip_and_each_message_arrives_as_a_lane_message(
    redis_url: str,
) -> None:
    # Given a publisher and a batch of five noop items and one exif item
    specs = all_lanes({})
    publisher = RedisPublisher(build_broker(redis_url), specs)
    items = [Publish(i, 3, "noop") for i in range(11, 16)] + [Publish(20, 1, "exif")]
    sent = _count_round_trips(publisher.broker.client)
    # When it publishes them
    publisher.publish(items)
    # Then no message was sent as a command of its own (they went in one pipeline)
    assert sent == [], sent
    # And a consumer fetches every one, in order, as the lane's message of its (item, token)
    consumer = build_broker(redis_url)
    noop = [Message.decode(d) for d in consumer.do_fetch(specs["noop"].queue, 10)]
    exif = [Message.decode(d) for d in consumer.do_fetch(specs["exif"].queue, 10)]
    assert [(m.actor_name, m.queue_name, m.args) for m in noop] == [
        ("lane_noop", "photojobs.noop", (i, 3)) for i in range(11, 16)
    ]
    assert [(m.actor_name, m.args) for m in exif] == [("lane_exif", (20, 1))]
    assert publisher.held(items) == {p.message_id for p in items}


def test_a_batch_message_holds_every_item_it_names_while_a_live_worker_has_it(redis_url: str) -> None:
    # Given 64 noop items published as batch messages of 16 (as a dispatch groups them), and a
    # live and a dead consumer
    specs = all_lanes({})
    publisher = RedisPublisher(build_broker(redis_url), specs)
    queue = specs["noop"].queue
    items = [Publish(i, 0, "noop", age=3.0, group=(i - 1) // 16) for i in range(1, 65)]
    publisher.publish(items)
    live, dead = build_broker(redis_url), build_broker(redis_url)
    # When the live one fetches the first message, the dead one the second, then stops beating
    [first] = [Message.decode(d) for d in live.do_fetch(queue, 1)]
    [second] = [Message.decode(d) for d in dead.do_fetch(queue, 1)]
    past = int((time.time() - LIVE_WITHIN - 1) * 1000)
    publisher.broker.client.zadd(f"{NAMESPACE}:__heartbeats__", {dead.broker_id: past})
    # Then the messages are batches, and every item of the live one's and of the waiting ones is
    # held, none of the dead one's
    assert len(first.args) > 2 and len(second.args) > 2
    dead_items = set(second.args[::2])
    held = publisher.held(items)
    assert held == {p.message_id for p in items if p.item_id not in dead_items}
    assert {p.item_id for p in items if p.message_id not in held} == dead_items
