"""A submission chunk's cost (issue 32): a fixed few statements whatever the chunk's size, none with
a parameter set per photo on PostgreSQL, and the same rows and events as the executemany before it.

Counted with a ``before_cursor_execute`` listener (as ``test_statement_budget``), on both stores.
Not a timing test: a regression to per-photo statements or an executemany per chunk fails loudly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store import submission as store_submission
from store.engine import make_engine
from store.events import read_events
from store.lanes import lane_spec
from store.models import Item, Photo
from tests.support import wait_for, waiting_for_a_lock

NOOP = lane_spec("noop", env={})
EXIF = lane_spec("exif", env={})

# A chunk's statements. PostgreSQL: the job's share lock, the known photos' row locks, the photos'
# upsert, the items with their events (one statement), the job's landed count. SQLite: the job, the
# clock, the photos (one executemany), their ids, the largest item id, the items (one executemany),
# their events, the job's landed count.
CHUNK_STATEMENTS = {"postgresql": 5, "sqlite": 8}
LAND_CHUNK = store_submission._land_chunk


class Counter:
    def __init__(self) -> None:
        self.statements: list[tuple[str, bool]] = []

    def __call__(self, conn, cursor, statement, parameters, context, executemany) -> None:  # type: ignore[no-untyped-def]
        if not statement.lstrip().upper().startswith("BEGIN"):
            self.statements.append((statement, executemany))


@contextmanager
def counting(engine: Engine) -> Iterator[Counter]:
    counter = Counter()
    event.listen(engine, "before_cursor_execute", counter)
    try:
        yield counter
    finally:
        event.remove(engine, "before_cursor_execute", counter)


def photos(tmp_path: Path, n: int, tag: str = "p") -> list[store_jobs.PhotoInput]:
    return [store_jobs.PhotoInput(str(tmp_path / f"{tag}{i:05d}.jpg"), 1, 1000.0 + i) for i in range(n)]


def chunk_statements(
    engine: Engine, monkeypatch: pytest.MonkeyPatch, job_photos: list[store_jobs.PhotoInput]
) -> list[list[tuple[str, bool]]]:
    """Submit the photos over two lanes in one chunk each; the statements of each chunk."""
    chunks: list[list[tuple[str, bool]]] = []
    land = LAND_CHUNK

    def spy(*args: Any) -> int | None:
        with counting(engine) as counter:
            out = land(*args)
        chunks.append(counter.statements)
        return out

    monkeypatch.setattr(store_submission, "_land_chunk", spy)
    monkeypatch.setattr(store_submission, "CHUNK_FIRST", len(job_photos))
    monkeypatch.setattr(store_submission, "CHUNK_MAX", len(job_photos))
    store_jobs.submit(engine, [NOOP, EXIF], job_photos)
    return chunks


def explain(statements: list[tuple[str, bool]]) -> str:
    return "\n".join(
        f"  {i + 1}. {'(executemany) ' if many else ''}{s.strip().splitlines()[0][:120]}"
        for i, (s, many) in enumerate(statements)
    )


def test_a_chunk_costs_the_same_few_statements_for_any_size(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a chunk of 20 photos and one of 400 (two lanes: 40 and 800 items)
    small = chunk_statements(engine, monkeypatch, photos(tmp_path, 20, "s"))
    large = chunk_statements(engine, monkeypatch, photos(tmp_path, 400, "l"))
    # Then each is one chunk of the store's fixed few statements
    budget = CHUNK_STATEMENTS[engine.dialect.name]
    assert len(small) == 1 and len(large) == 1
    assert len(small[0]) == budget, f"a chunk of 20 ran:\n{explain(small[0])}"
    assert len(large[0]) == budget, f"a chunk of 400 ran:\n{explain(large[0])}"
    # And on PostgreSQL none is an executemany (psycopg's pipeline sends those row by row)
    if engine.dialect.name == "postgresql":
        assert not [s for s, many in large[0] if many], explain(large[0])


def test_a_chunk_writes_each_item_and_its_event_in_photo_then_lane_order(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a photo the store knows without a file time, and one it knows with one
    given = photos(tmp_path, 6)
    with Session(engine) as s, s.begin():
        s.add(Photo(path=given[1].path, size=1, updated_at=0.0, file_time=None))
        s.add(Photo(path=given[4].path, size=1, updated_at=0.0, file_time=7.0))
    # When six photos (not in path order) are submitted over two lanes
    order = [given[i] for i in (3, 1, 5, 0, 4, 2)]
    job = store_jobs.submit(engine, [NOOP, EXIF], order).job_id
    # Then the items run photo by photo in the order given, each photo's lanes in pipeline order
    with Session(engine) as s:
        items = s.execute(
            select(Item.id, Item.lane, Item.position, Item.state, Photo.path)
            .join(Photo, Photo.id == Item.photo_id)
            .where(Item.job_id == job)
            .order_by(Item.id)
        ).all()
        times = dict(s.execute(select(Photo.path, Photo.file_time)).all())
    expected = [
        (p.path, lane, pos, state)
        for p in order
        for lane, pos, state in [("noop", 0, "pending"), ("exif", 1, "waiting")]
    ]
    assert [(r.path, r.lane, r.position, r.state) for r in items] == expected
    # And each item has one item_created event with its photo, lane and state, in item id order
    created = [e for e in read_events(engine, job_id=job, limit=1000) if e.type == "item_created"]
    assert [(e.item, e.lane, e.detail) for e in created] == [
        (r.id, r.lane, {"state": r.state}) for r in items
    ]
    with Session(engine) as s:
        photo_of = dict(s.execute(select(Item.id, Item.photo_id).where(Item.job_id == job)).all())
    assert all(e.photo == photo_of[e.item] and e.job == job for e in created)
    # And a known photo's file time is the one recorded first; a missing one is filled in
    assert times[given[4].path] == 7.0 and times[given[1].path] == given[1].mtime
    assert times[given[0].path] == given[0].mtime


def test_a_photo_another_submission_inserts_meanwhile_is_found(pg_url: str, tmp_path: Path) -> None:
    # Given another transaction that has inserted one of the photos, not yet committed
    engine = make_engine(pg_url)
    holder = engine.connect()
    try:
        given = photos(tmp_path, 5)
        tx = holder.begin()
        theirs = holder.execute(
            text("INSERT INTO photos (path, size, updated_at, file_time) VALUES (:p, 1, 0, 7) RETURNING id"),
            {"p": given[2].path},
        ).scalar_one()
        result: list[Any] = []
        submitter = threading.Thread(target=lambda: result.append(store_jobs.submit(engine, [NOOP], given)))
        # When a submission of the five photos runs (its upsert waits for that row) and it commits
        submitter.start()
        wait_for(lambda: waiting_for_a_lock(engine) >= 1, 30, what="the submission to wait for the photo row")
        tx.commit()
        submitter.join(60)
        # Then the submission completed, its item of that photo on the other transaction's row,
        # whose file time stays the one recorded first
        assert not submitter.is_alive() and len(result) == 1
        job = result[0].job_id
        with Session(engine) as s:
            photo_ids = s.execute(select(Item.photo_id).where(Item.job_id == job)).scalars().all()
            file_time = s.execute(select(Photo.file_time).where(Photo.id == theirs)).scalar_one()
        assert len(photo_ids) == 5 and theirs in photo_ids and file_time == 7.0
    finally:
        holder.close()
        engine.dispose()
