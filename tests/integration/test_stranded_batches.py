"""When a prefetched message is judged stranded in a live worker's ack set (issue 22, 7): a message
waits there behind the messages its worker runs, and a batch message may run its lane's time limit
once per item, so the threshold counts the lane's batch (``store.dispatch.stranded_after``)."""

from __future__ import annotations

from photojobs.broker import RedisPublisher, build_broker
from store.dispatch import Publish, stranded_after
from store.lanes import all_lanes


def test_a_message_prefetched_behind_batches_is_held_for_twice_a_whole_batchs_time_limits(
    redis_url: str,
) -> None:
    # Given a lane with a 1 s time limit whose messages carry up to 16 items, and a message of it
    # fetched by a live consumer that has not run it yet (its worker's threads are busy with batches)
    specs = all_lanes({"PHOTOJOBS_LANE_NOOP_TIME_LIMIT": "1", "PHOTOJOBS_LANE_NOOP_BATCH": "16"})
    spec = specs["noop"]
    assert spec.effective_batch == 16
    publisher = RedisPublisher(build_broker(redis_url), specs)
    publisher.publish([Publish(1, 1, "noop")])
    assert len(build_broker(redis_url).do_fetch(spec.queue, 1)) == 1
    # When it has waited there 3 s (over twice one item's limit, well under one batch's run) and
    # then twice a whole batch's time limits
    waiting, stranded = Publish(1, 1, "noop", age=3.0), Publish(1, 1, "noop", age=stranded_after(spec))
    # Then it is still held (not published again while its worker is alive), and only then given up
    assert publisher.held([waiting]) == {"pj-1-1"}
    assert publisher.held([stranded]) == set()
