"""Priority in the dispatcher (``store.dispatch``), on SQLite and PostgreSQL: a small job is dispatched
to the interactive queue even when the lane's own bound is full; an explicit priority overrides the
size rule; a stale interactive message is republished as interactive."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, update
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store.dispatch import interactive_bound, stale_queued, take_for_dispatch
from store.lanes import lane_spec
from store.models import Job
from tests.support import item_states, items_of

NOOP = lane_spec("noop", env={})


def _submit(engine: Engine, folder: Path, n: int, priority: str | None = None) -> int:
    photos = [store_jobs.PhotoInput(str(folder / f"{folder.name}-{i}.jpg"), 1) for i in range(n)]
    job = store_jobs.submit(engine, [NOOP], photos).job_id
    if priority is not None:  # as Client.submit(priority=) records it
        with Session(engine) as s, s.begin():
            s.execute(update(Job).where(Job.id == job).values(priority=priority))
    return job


def _item_ids(engine: Engine, job: int) -> set[int]:
    return {i.id for i in items_of(engine, job)}


def test_a_small_job_is_dispatched_interactive_while_the_lane_is_full(engine: Engine, tmp_path: Path) -> None:
    # Given a big job that fills the lane's bound of messages in Redis
    big = _submit(engine, tmp_path / "big", NOOP.item_bound + 500)
    first = take_for_dispatch(engine, NOOP)
    assert first and not any(p.interactive for p in first)
    assert take_for_dispatch(engine, NOOP) == []  # the lane is full
    # When a one-photo job is submitted and the dispatcher runs again
    small = _submit(engine, tmp_path / "small", 1)
    out = take_for_dispatch(engine, NOOP)
    # Then the small job's item is queued, marked interactive, and nothing more of the big job
    assert [p.interactive for p in out] == [True]
    assert item_states(engine, small) == {"queued": 1}
    assert item_states(engine, big).get("queued") == len(first)


def test_an_explicit_priority_overrides_the_size_rule(engine: Engine, tmp_path: Path) -> None:
    # Given a big job that fills the lane's bound of messages in Redis
    big = _submit(engine, tmp_path / "big", NOOP.item_bound + 500)
    assert take_for_dispatch(engine, NOOP)
    # When a 3-photo job submitted as normal and a 40-photo job submitted as interactive arrive
    normal = _submit(engine, tmp_path / "n", 3, "normal")
    urgent = _submit(engine, tmp_path / "u", 40, "interactive")
    out = take_for_dispatch(engine, NOOP)
    # Then the small normal job waits for room in the lane like the big one, and the big
    # interactive one is dispatched to the interactive queue, within its own bound of messages
    assert item_states(engine, normal) == {"pending": 3}
    assert item_states(engine, urgent) == {"queued": 40}
    assert {p.item_id for p in out} == _item_ids(engine, urgent) and all(p.interactive for p in out)
    messages = {p.group if p.group is not None else -p.item_id for p in out}
    assert len(messages) <= interactive_bound(NOOP)
    assert "pending" in item_states(engine, big)


def test_on_an_idle_lane_a_small_job_takes_the_lanes_own_queue(engine: Engine, tmp_path: Path) -> None:
    # Given a lane with nothing queued
    # When a one-photo job is dispatched
    small = _submit(engine, tmp_path / "small", 1)
    out = take_for_dispatch(engine, NOOP)
    # Then it goes to the lane's own queue: there is nothing to overtake
    assert [(p.item_id, p.interactive) for p in out] == [(min(_item_ids(engine, small)), False)]


def test_a_stale_interactive_message_is_republished_as_interactive(engine: Engine, tmp_path: Path) -> None:
    # Given a big job's items queued, then a small job's item queued (its message then lost)
    _submit(engine, tmp_path / "big", 40)
    big = take_for_dispatch(engine, NOOP)
    _submit(engine, tmp_path / "s", 1)
    [p] = take_for_dispatch(engine, NOOP)
    assert p.interactive
    # When the sweeper looks for stale queued items
    stale = {q.item_id: q.interactive for q in stale_queued(engine, older_than=-1.0)}
    # Then it knows the small job's item travels in the interactive queue, the big job's not
    assert stale == {p.item_id: True, **{q.item_id: False for q in big}}
