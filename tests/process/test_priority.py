"""Priority with real workers (SQLite and PostgreSQL): a job submitted while a big job fills Redis and
the workers' prefetch runs before the big job's queued backlog — a small job by its size, a larger
one by its explicit priority — and one submitted ``priority="normal"`` waits its turn. Asserted on
the order of the events, never on times."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from store.models import Event, Item
from tests.support import Fleet, item_states, make_files, wait_for, wait_job_done

BIG = 800
BACKLOG = 200
BATCH = 16  # the noop lane's batch: two threads may each finish one batch of the backlog late


def _queued_items(engine: Engine, job: int) -> set[int]:
    with Session(engine) as s:
        return set(s.execute(select(Item.id).where(Item.job_id == job, Item.state == "queued")).scalars())


def _at_least(items: set[int], n: int) -> set[int] | None:
    return items if len(items) >= n else None


def _success_order(engine: Engine) -> list[tuple[int, int]]:
    """(job, item) of every item_succeeded, in the order of the log (``seq``, numbered in commit order)."""
    with Session(engine) as s:
        rows = s.execute(
            select(Event.job_id, Event.item_id)
            .where(Event.type == "item_succeeded", Event.seq.is_not(None))
            .order_by(Event.seq)
        ).all()
    return [(r.job_id, r.item_id) for r in rows]


def _overtaken(engine: Engine, small: int, backlog: set[int]) -> int:
    """How many of the ``backlog`` items succeeded after the small job's last item."""
    order = _success_order(engine)
    last_small = max(i for i, (job, _) in enumerate(order) if job == small)
    return sum(1 for job, item in order[last_small + 1 :] if item in backlog)


def _busy_big_job(
    engine: Engine,
    env: dict[str, str],
    fleet: Fleet,
    tmp_path: Path,
    *,
    threads: int = 2,
    sleep: str = "0.02",
) -> tuple[Client, int, set[int]]:
    """A big noop job running on one worker of ``threads`` threads, with its messages waiting in Redis
    and prefetched: the client, the job and its items queued at that moment (at least ``BACKLOG``)."""
    make_files(tmp_path / "big", BIG)
    client = Client(Settings.from_env(env))
    big = client.submit(["noop"], [tmp_path / "big"], {"noop.sleep": sleep}).job_id
    fleet.start_sweeper()
    fleet.start_worker(["noop"], threads=threads)
    wait_for(lambda: item_states(engine, big).get("succeeded", 0) >= 1, 60, what="the big job under way")
    backlog = wait_for(lambda: _at_least(_queued_items(engine, big), BACKLOG), 60, what="a backlog")
    return client, big, backlog


def _all_numbered(engine: Engine) -> bool:
    with Session(engine) as s:
        return s.execute(select(Event.id).where(Event.seq.is_(None)).limit(1)).first() is None


def test_a_one_photo_job_runs_before_the_big_jobs_queued_backlog(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a big job whose messages fill Redis and the worker's prefetch
    client, big, backlog = _busy_big_job(engine, env, fleet, tmp_path)
    # When a one-photo job is submitted (no priority given: interactive by its size)
    make_files(tmp_path / "one", 1)
    small = client.submit(["noop"], [tmp_path / "one"]).job_id
    wait_job_done(engine, small, 120)
    wait_job_done(engine, big, 300)
    wait_for(lambda: _all_numbered(engine), 60, what="every event numbered")
    # Then it succeeded before most of the big job's items that were queued when it was submitted
    overtaken = _overtaken(engine, small, backlog)
    assert overtaken >= len(backlog) // 2, (overtaken, len(backlog))
    client.engine.dispose()


def test_an_explicit_priority_decides_who_goes_first(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a big job whose messages fill Redis and the worker's prefetch
    client, big, backlog = _busy_big_job(engine, env, fleet, tmp_path)
    # When a one-photo job is submitted as normal, and a 40-photo job as interactive
    make_files(tmp_path / "one", 1)
    make_files(tmp_path / "forty", 40)
    normal = client.submit(["noop"], [tmp_path / "one"], priority="normal").job_id
    urgent = client.submit(["noop"], [tmp_path / "forty"], priority="interactive").job_id
    for job in (normal, urgent, big):
        wait_job_done(engine, job, 300)
    wait_for(lambda: _all_numbered(engine), 60, what="every event numbered")
    # Then the interactive job overtook most of the backlog, and the normal one waited behind it
    # (but for the batches the worker's two threads were running when it started)
    assert _overtaken(engine, urgent, backlog) >= len(backlog) // 2
    assert _overtaken(engine, normal, backlog) <= 2 * BATCH
    client.engine.dispose()


def _finished_around(engine: Engine, small: int, big: int) -> tuple[int] | None:
    """How many of the big job's items were claimed before the small job's item and succeeded after
    it, as a 1-tuple (``wait_for`` wants a truthy value); None until every event is numbered and
    each of those items has succeeded."""
    with Session(engine) as s:
        rows = s.execute(
            select(Event.type, Event.job_id, Event.item_id, Event.seq)
            .where(Event.type.in_(("item_claimed", "item_succeeded")), Event.job_id.in_((small, big)))
            .order_by(Event.seq)
        ).all()
    if any(r.seq is None for r in rows):
        return None
    at = {(r.type, r.job_id, r.item_id): i for i, r in enumerate(rows)}
    claimed = [v for (t, j, _), v in at.items() if j == small and t == "item_claimed"]
    succeeded = [v for (t, j, _), v in at.items() if j == small and t == "item_succeeded"]
    if not claimed or not succeeded:
        return None
    before = [item for (t, j, item), v in at.items() if j == big and t == "item_claimed" and v < min(claimed)]
    if any(("item_succeeded", big, item) not in at for item in before):
        return None  # the batch that was running is not finished yet
    return (sum(1 for item in before if at[("item_succeeded", big, item)] > max(succeeded)),)


def test_a_one_photo_job_runs_between_the_items_of_the_batch_its_only_thread_is_running(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a big job on a worker with one thread, running batch messages of 16 slow items
    client, big, _ = _busy_big_job(engine, env, fleet, tmp_path, threads=1, sleep="0.05")
    # When a one-photo job is submitted
    make_files(tmp_path / "one", 1)
    small = client.submit(["noop"], [tmp_path / "one"]).job_id
    wait_job_done(engine, small, 120)
    # Then it ran inside the batch the thread was running: items of the big job claimed before it
    # finished after it (without that, the one thread finishes its whole batch first)
    (around,) = wait_for(lambda: _finished_around(engine, small, big), 60, what="the batch around it done")
    assert around >= 1
    client.cancel(big)
    client.engine.dispose()
