"""Which items share a message: the dispatcher's plan (``store.dispatch.plan_messages``), the
publisher's grouping (``message_groups``), batch message ids, and the lane message schema for batch
messages (``store.lanes.LaneSpec.message_args_valid``)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from store.dispatch import Publish, batch_message_id, items_of_message_id, message_groups, plan_messages
from store.lanes import MAX_BATCH, LaneSpec, lane_spec

NOOP = replace(lane_spec("noop", env={}), threads=4, fleet_processes=2, batch=8)  # 8 threads in the fleet


@dataclass(frozen=True)
class Row:
    id: int
    job_id: int = 1
    attempt: int = 0


def rows(n: int, start: int = 1, job: int = 1, attempt: int = 0) -> list[Row]:
    return [Row(i, job, attempt) for i in range(start, start + n)]


def plan(items: list[Row], spec: LaneSpec = NOOP, max_messages: int = 1000) -> list[list[Row]]:
    return plan_messages(items, spec, max_messages, lambda r: r.job_id, lambda r: r.attempt == 0)


def test_first_attempts_share_messages_up_to_the_batch_and_in_order() -> None:
    # Given 100 first attempts of one job, in a lane with batches of 8 and 8 threads in the fleet
    items = rows(100)
    # When the dispatcher plans their messages
    messages = plan(items)
    # Then no message names more than 8, sizes differ by at most one, and the items keep their order
    assert max(len(m) for m in messages) == 8 and min(len(m) for m in messages) >= 7
    assert [r for m in messages for r in m] == items


def test_a_small_dispatch_still_spreads_over_every_thread() -> None:
    # Given fewer first attempts than two per thread of the fleet
    for n in (1, 5, 8, 12):
        # Then there are as many messages as threads can take (or one per item)
        assert len(plan(rows(n))) == min(n, 8), n


def test_retries_go_alone_and_batches_never_mix_jobs() -> None:
    # Given a retry, and first attempts of two jobs
    retry = Row(1, 1, attempt=1)
    a, b = rows(20, start=10, job=1), rows(20, start=40, job=2)
    # When planned
    messages = plan([retry, *a, *b])
    # Then the retry has a message of its own, and every other message holds one job's items
    assert [retry] in messages
    assert all(len({r.job_id for r in m}) == 1 for m in messages)
    assert sorted(r.id for m in messages for r in m) == sorted(r.id for r in [retry, *a, *b])


def test_the_plan_keeps_to_the_message_room() -> None:
    # Given 100 first attempts and room for 5 messages
    messages = plan(rows(100), max_messages=5)
    # Then 5 full messages go, the rest stay pending
    assert [len(m) for m in messages] == [8] * 5


def test_little_message_room_gets_full_messages_not_a_spread() -> None:
    # Given 16 first attempts (two messages' worth) and room for one message in Redis (a top-up)
    messages = plan(rows(16), max_messages=1)
    # Then that one message is full: spreading over the threads never shrinks what fits in the room
    assert [len(m) for m in messages] == [8]
    # And with room for three, the 16 spread over all three (the fleet has threads for more)
    assert [len(m) for m in plan(rows(16), max_messages=3)] == [6, 5, 5]


def test_a_lane_with_a_single_attempt_never_batches() -> None:
    # Given a lane whose items have one attempt (a batch-mate killed with a bad photo could not retry)
    single = replace(NOOP, max_attempts=1)
    # Then each item is a message of its own
    assert all(len(m) == 1 for m in plan(rows(40), single))


def test_the_publisher_groups_a_dispatch_by_message_and_sends_the_rest_alone() -> None:
    items = [Publish(1, 0, "noop", group=0), Publish(2, 0, "noop", group=0), Publish(3, 1, "noop")]
    items += [Publish(4, 0, "noop", group=1), Publish(5, 0, "exif", group=1)]
    assert message_groups(items) == [items[0:2], [items[2]], [items[3]], [items[4]]]


def test_a_batch_message_id_names_every_item_it_carries() -> None:
    group = [Publish(7, 1, "noop"), Publish(9, 0, "noop")]
    assert batch_message_id(group) == "pj-7-1.pj-9-0"
    assert items_of_message_id(batch_message_id(group)) == ["pj-7-1", "pj-9-0"]
    assert items_of_message_id("pj-7-1") == ["pj-7-1"]


def test_the_schema_takes_pairs_and_refuses_odd_repeated_or_oversized_batches() -> None:
    assert NOOP.message_args_valid([1, 0], {}) is None
    assert NOOP.message_args_valid([1, 0, 2, 5], {}) is None
    assert "several such pairs" in (NOOP.message_args_valid([1, 0, 2], {}) or "")
    assert "names an item twice" in (NOOP.message_args_valid([1, 0, 1, 1], {}) or "")
    assert "positive integer" in (NOOP.message_args_valid([1, 0, "x", 1], {}) or "")
    too_many = [x for i in range(1, MAX_BATCH + 2) for x in (i, 0)]
    assert f"at most {MAX_BATCH} items" in (NOOP.message_args_valid(too_many, {}) or "")
