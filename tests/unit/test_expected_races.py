"""An expected race logs no traceback (issue 40): two uploads of identical content meet at one target
name -- the store refuses the second intent (``TargetTaken``) or the name is taken on disk
(``FileExistsError``) -- and the item is retried (its next attempt finds the target settled). That
is logged as one warning line naming the item and the race, never a traceback, and the item's
error keeps no trace. Dramatiq's StubBroker, the real lane actor and lease middleware, a real
SQLite store (tests/unit/test_batch_messages.py's harness)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from middleware.context import ItemContext
from store.intents import TargetTaken
from store.models import Event
from tests.unit.test_batch_messages import BatchHarness


@pytest.fixture
def harness(sqlite_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[BatchHarness]:
    h = BatchHarness(sqlite_engine, monkeypatch)
    yield h
    h.close()


def _body(races: dict[int, BaseException]):  # type: ignore[no-untyped-def]
    def body(ctx: ItemContext) -> dict[str, int]:
        if ctx.item_id in races:
            raise races[ctx.item_id]
        return {"item": ctx.item_id}

    return body


@pytest.mark.parametrize("batched", [True, False], ids=["batch-message", "one-item-message"])
def test_an_expected_race_is_retried_with_a_warning_and_no_traceback(
    harness: BatchHarness, caplog: pytest.LogCaptureFixture, batched: bool
) -> None:
    # Given two items whose target another item took first: in the store, and on disk
    items = harness.submit(3)
    races: dict[int, BaseException] = {
        items[0]: TargetTaken("/up/IMG_0001.jpg is claimed by intent 7"),
        items[1]: FileExistsError(17, "target already exists", "/up/IMG_0002.jpg"),
    }
    harness.body = _body(races)
    caplog.set_level(logging.INFO)
    # When their messages are processed (one batch message, or a message each)
    if batched:
        harness.deliver([(i, 0) for i in items])
    else:
        for i in items:
            harness.deliver([(i, 0)])
    # Then both are pending for a retry, their errors naming the race, the third succeeded
    for item_id, exc in races.items():
        row = harness.item(item_id)
        assert row.state == "pending", row.state
        assert type(exc).__name__ in (row.error or "")
    assert harness.item(items[2]).state == "succeeded"
    # And no traceback was logged, nor kept with the failed attempts
    traced = [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text]
    assert traced == []
    assert not [r for r in caplog.records if "unhandled" in r.getMessage()]
    with Session(harness.engine) as s:
        payloads = s.execute(
            select(Event.detail).where(Event.item_id.in_(list(races)), Event.type == "item_retry_scheduled")
        ).scalars().all()
    assert len(payloads) == 2 and all(not (p or {}).get("traceback") for p in payloads)
