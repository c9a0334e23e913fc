"""A batch message's claim is the single claim's compare-and-set, for every item at once
(``store.queries.claim_many_sql``, one statement): each item is claimed only with its message's
token, only while it is queued or pending, and never in a paused lane. Each check is proven here
alone (the mutation suite breaks each one: tests/mutants/mutations.toml), on both stores."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from store import items as store_items
from store.lane_control import pause_lane
from store.leases import ClaimRefusal
from store.models import Item
from tests.integration.test_batch_claims import NOOP, queued
from tests.support import events_of


def _state(engine: Engine, item_id: int) -> tuple[str, int, int]:
    with Session(engine) as s:
        row = s.get(Item, item_id)
        assert row is not None
        return row.state, row.fencing_token, row.attempt


def test_a_batch_claim_refuses_the_item_whose_message_token_is_stale_and_claims_the_rest(
    engine: Engine, tmp_path: Path
) -> None:
    # Given three queued items, and a batch message whose token for the second is an older one
    items = queued(engine, NOOP, [tmp_path / f"p{i}.jpg" for i in range(3)])
    (a, ta, _), (b, tb, _), (c, tc, _) = items
    before = _state(engine, b)
    # When a worker claims the batch
    outcomes = store_items.claim_batch(engine, NOOP, [(a, ta), (b, tb - 1), (c, tc)], "w", {})
    # Then the first and third are claimed; the second is refused and left as it was, unclaimed
    assert [o.lease is not None for o in outcomes] == [True, False, True]
    assert _state(engine, b) == before
    assert events_of(engine, "item_claimed", b) == []


def test_a_batch_claim_refuses_an_item_that_is_running_even_with_its_current_token(
    engine: Engine, tmp_path: Path
) -> None:
    # Given three queued items, the second already claimed by another worker (a duplicate message
    # carrying the token that claim gave it: only the state check can refuse it)
    items = queued(engine, NOOP, [tmp_path / f"p{i}.jpg" for i in range(3)])
    (a, ta, _), (b, tb, _), (c, tc, _) = items
    holder = store_items.claim(engine, NOOP, b, tb, "other")
    assert holder.lease is not None
    running = _state(engine, b)
    # When a worker claims the batch with the second item's current token
    outcomes = store_items.claim_batch(engine, NOOP, [(a, ta), (b, holder.lease.token), (c, tc)], "w", {})
    # Then the running item is refused and keeps its holder, token and attempt; the rest are claimed
    assert [o.lease is not None for o in outcomes] == [True, False, True]
    assert _state(engine, b) == running
    with Session(engine) as s:
        row = s.get(Item, b)
        assert row is not None and row.lease_owner == "other"
    assert len(events_of(engine, "item_claimed", b)) == 1


def test_a_batch_claim_in_a_paused_lane_claims_nothing(engine: Engine, tmp_path: Path) -> None:
    # Given three queued items of a lane that is then paused
    items = queued(engine, NOOP, [tmp_path / f"p{i}.jpg" for i in range(3)])
    assert pause_lane(engine, "noop", "test")
    # When their batch message is delivered
    outcomes = store_items.claim_batch(engine, NOOP, [(i, t) for i, t, _ in items], "w", {})
    # Then none is claimed, each refused for the pause, and no claim event is written
    assert [o.lease for o in outcomes] == [None, None, None]
    assert {o.refusal for o in outcomes} == {ClaimRefusal.LANE_PAUSED}, [o.reason for o in outcomes]
    for item_id, _, _ in items:
        assert _state(engine, item_id)[0] in ("queued", "pending")
        assert events_of(engine, "item_claimed", item_id) == []
