"""The top-up dispatches in batches (issue 9): ``take_for_dispatch(min_room=k)`` looks at the lane's
room in a read-only transaction and writes nothing — on SQLite takes no write lock — until ``k``
messages fit; then it fills the room. On SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Engine, event

from store import items as store_items
from store import jobs as store_jobs
from store.dispatch import take_for_dispatch
from store.lanes import lane_spec

NOOP = dataclasses.replace(lane_spec("noop", env={}), bound=8)


@contextmanager
def statements(engine: Engine) -> Iterator[list[str]]:
    seen: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        seen.append(statement.strip().split()[0].upper() + " " + statement.strip()[:80])

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def writes(seen: list[str]) -> list[str]:
    """The statements that write or take SQLite's write lock."""
    return [s for s in seen if s.split()[0] in ("UPDATE", "INSERT", "DELETE") or "IMMEDIATE" in s]


def test_a_batched_top_up_writes_nothing_until_a_batch_fits_then_fills_the_room(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a one-lane job of 12 items on a lane bounded to 8 messages, dispatched once (8 queued)
    photos = [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg"), 1) for i in range(12)]
    store_jobs.submit(engine, [NOOP], photos)
    first = take_for_dispatch(engine, NOOP)
    assert len(first) == 8

    # When one queued item is claimed (room for 1) and the top-up asks for a batch of 2
    assert store_items.claim(engine, NOOP, first[0].item_id, first[0].token, "w").lease is not None
    with statements(engine) as seen:
        none = take_for_dispatch(engine, NOOP, min_room=2)

    # Then nothing is dispatched and nothing written: one read of the lane's queued count
    assert none == []
    assert seen and writes(seen) == [], seen

    # When a second item is claimed (room for 2)
    assert store_items.claim(engine, NOOP, first[1].item_id, first[1].token, "w").lease is not None
    with statements(engine) as seen:
        batch = take_for_dispatch(engine, NOOP, min_room=2)

    # Then the room is filled, in one write transaction
    assert len(batch) == 2
    assert {p.item_id for p in batch}.isdisjoint(p.item_id for p in first)
    assert any(s.startswith("UPDATE") for s in seen), seen

    # And without min_room the old behaviour stands: one free slot is filled at once
    assert store_items.claim(engine, NOOP, first[2].item_id, first[2].token, "w").lease is not None
    assert len(take_for_dispatch(engine, NOOP)) == 1
