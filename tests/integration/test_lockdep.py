"""The lock-order checker (store/lockdep.py) catches a transaction that locks against the global
order, in this process and in a process it starts, and lets the orders the store keeps pass."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, select, update
from sqlalchemy.orm import Session

from store import jobs as store_jobs
from store import lockdep
from store.engine import make_engine
from store.lanes import all_lanes
from store.models import Item, Job, Photo
from store.photo_locks import lock_photo_rows
from tests.support import ROOT


@pytest.fixture
def checked(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Engine, str]]:
    """A PostgreSQL engine whose violations go to a folder of this test's own (not the session's,
    which would fail this test), with a two-photo job in its store."""
    folder = str(tmp_path / "lockdep")
    monkeypatch.setenv(lockdep.ENV, folder)
    engine = make_engine(pg_url)
    monkeypatch.undo()
    spec = all_lanes({})["analysis"]
    store_jobs.submit(engine, [spec], [store_jobs.PhotoInput(str(tmp_path / f"p{i}.jpg")) for i in range(2)])
    yield engine, folder
    engine.dispose()


def _ids(engine: Engine) -> tuple[int, list[int], list[int]]:
    with Session(engine) as s:
        job = s.execute(select(Job.id)).scalar_one()
        items = list(s.execute(select(Item.id).order_by(Item.id)).scalars())
        photos = list(s.execute(select(Photo.id).order_by(Photo.id)).scalars())
    return job, items, photos


def test_an_item_then_its_job_is_caught(checked: tuple[Engine, str]) -> None:
    # Given a store under the checker
    engine, folder = checked
    job, items, _ = _ids(engine)
    # When one transaction locks an item, then its job (the reverse of job -> item)
    with Session(engine) as s, s.begin():
        s.execute(select(Item.id).where(Item.id == items[0]).with_for_update()).all()
        s.execute(select(Job.id).where(Job.id == job).with_for_update(read=True)).all()
    # Then the violation is recorded with the transaction's statements
    found = lockdep.read_violations(folder)
    assert len(found) == 1
    assert found[0]["problems"] == [
        "table order: FOR SHARE on jobs while holding rows of items (the order is "
        "jobs -> items -> photos -> intents -> photo_locks -> counters)"
    ]
    assert "FROM items" in found[0]["transaction"][0] and "FROM jobs" in found[0]["transaction"][1]
    assert any("test_lockdep.py" in line for line in found[0]["stack"])
    assert "lock order violated" in lockdep.format_violation(found[0])
    assert lockdep.failing(found[0]) and found[0]["known"] is None


def test_a_photo_then_an_item_by_update_is_caught(checked: tuple[Engine, str]) -> None:
    # Given a store under the checker
    engine, folder = checked
    _, items, photos = _ids(engine)
    # When a transaction updates a photo, then an item it did not hold
    with Session(engine) as s, s.begin():
        s.execute(update(Photo).where(Photo.id == photos[0]).values(size=1))
        s.execute(update(Item).where(Item.id == items[1]).values(error="x"))
    # Then
    assert [v["problems"][0].split(" (")[0] for v in lockdep.read_violations(folder)] == [
        "table order: UPDATE on items while holding rows of photos"
    ]


def test_items_in_descending_id_are_caught(checked: tuple[Engine, str]) -> None:
    # Given a store under the checker
    engine, folder = checked
    _, items, _ = _ids(engine)
    # When a transaction locks the higher item, then the lower one
    with Session(engine) as s, s.begin():
        s.execute(select(Item.id).where(Item.id == items[1]).with_for_update()).all()
        s.execute(update(Item).where(Item.id == items[0]).values(error="x"))
    # Then
    found = lockdep.read_violations(folder)
    assert [v["problems"] for v in found] == [
        [f"ascending id: UPDATE on items id {items[0]} after id {items[1]} of that table"]
    ]
    assert lockdep.failing(found[0])  # fails the test that did it


def test_the_global_order_and_touching_held_rows_again_pass(checked: tuple[Engine, str]) -> None:
    # Given a store under the checker
    engine, folder = checked
    job, items, photos = _ids(engine)
    # When transactions keep job -> items (ascending) -> photos (ascending), update a held item again
    # after its photos, and lock a lower item only after a savepoint that held a higher one rolled back
    with Session(engine) as s, s.begin():
        s.execute(select(Job.id).where(Job.id == job).with_for_update(read=True)).all()
        s.execute(select(Item.id).where(Item.id.in_(items)).order_by(Item.id).with_for_update()).all()
        lock_photo_rows(s.connection(), photos)
        s.execute(update(Item).where(Item.id == items[0]).values(error=None))
    with Session(engine) as s, s.begin():
        with s.begin_nested() as nested:
            s.execute(select(Item.id).where(Item.id == items[1]).with_for_update()).all()
            nested.rollback()
        s.execute(select(Item.id).where(Item.id == items[0]).with_for_update()).all()
    # Then nothing is recorded
    found = lockdep.read_violations(folder)
    assert found == [], "\n".join(lockdep.format_violation(v) for v in found)


def test_a_violation_in_a_process_the_test_started_is_caught(
    checked: tuple[Engine, str], pg_url: str
) -> None:
    # Given a store under the checker and a child process inheriting the checker's variable
    engine, folder = checked
    job, items, _ = _ids(engine)
    script = (
        "from sqlalchemy import text\n"
        "from store.engine import make_engine\n"
        f"e = make_engine({pg_url!r})\n"
        "with e.begin() as c:\n"
        f"    c.execute(text('SELECT id FROM items WHERE id = :i FOR UPDATE'), {{'i': {items[0]}}})\n"
        f"    c.execute(text('SELECT id FROM jobs WHERE id = :j FOR UPDATE'), {{'j': {job}}})\n"
    )
    # When the child locks an item, then its job
    subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        check=True,
        env={**os.environ, lockdep.ENV: folder},
        timeout=60,
    )
    # Then its violation is in the folder, with its process id
    found = lockdep.read_violations(folder)
    assert len(found) == 1 and found[0]["pid"] != os.getpid()
    assert found[0]["problems"][0].startswith("table order: FOR UPDATE on jobs while holding rows of items")


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        (
            "SELECT items.id FROM items WHERE items.id = %(id_1)s::INTEGER FOR SHARE OF items",
            [("items", True)],
        ),
        (
            "SELECT items.id FROM items JOIN jobs ON jobs.id = items.job_id WHERE items.id IN "
            "(%(id_1_1)s::INTEGER, %(id_1_2)s::INTEGER) FOR UPDATE",
            [("items", True), ("jobs", False)],
        ),
        (
            "SELECT anon_1.job_id FROM (SELECT items.job_id AS job_id FROM items "
            "WHERE items.job_id IN (%(j)s) ORDER BY items.id FOR UPDATE) AS anon_1 GROUP BY anon_1.job_id",
            [("items", False)],
        ),
        ("DELETE FROM photo_locks WHERE item_id = %(item_id)s", [("photo_locks", False)]),
        (
            "UPDATE items SET x = 1 WHERE items.id IN (SELECT items.id FROM items FOR UPDATE)",
            [("items", False)] * 2,
        ),
        (
            "INSERT INTO photos (path) VALUES (%(p)s) ON CONFLICT (path) DO UPDATE SET size = 1",
            [("photos", False)],
        ),
        ("INSERT INTO photos (path) VALUES (%(p)s) ON CONFLICT (path) DO NOTHING", []),
        ("INSERT INTO photo_locks (photo_id) VALUES (%(p)s)", []),
        ("SELECT jobs.id FROM jobs WHERE jobs.id IN (SELECT items.job_id FROM items)", []),
        ("UPDATE events SET seq = 1", []),
    ],
)
def test_statements_are_classified_by_the_rows_they_lock(sql: str, expected: list[tuple[str, bool]]) -> None:
    # Given a statement, when it is classified, then its locked tables (and whether by id) come out
    assert sorted((lock.table, lock.id_params is not None) for lock in lockdep.classify(sql)) == sorted(
        expected
    )


def test_a_known_violation_is_marked_and_fails_no_test(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the stack of a bundle release made by a middle-lane succeed, listed as known
    monkeypatch.setitem(lockdep.KNOWN, ("store/items.py", "advance_pipeline"), "a known violation")
    frames = [
        traceback.FrameSummary("/w/middleware/lease.py", 1, "finish"),
        traceback.FrameSummary("/w/store/items.py", 2, "advance_pipeline"),
        traceback.FrameSummary("/w/store/items.py", 3, "release_bundle"),
    ]
    # When it is looked up, then it is the known one; a record of it fails no test, an unknown one does
    why = lockdep._known(frames)
    assert why == lockdep.KNOWN[("store/items.py", "advance_pipeline")]
    problem = ["table order: FOR UPDATE on items while holding rows of photo_locks"]
    assert not lockdep.failing({"problems": problem, "known": why})
    assert lockdep.failing({"problems": problem, "known": None})
    assert lockdep._known(frames[:1]) is None


def test_the_suite_fails_a_test_whose_transaction_broke_the_order(pg_url: str, tmp_path: Path) -> None:
    # Given a test (run by its own pytest with this suite's fixtures) that locks an item, then its job
    probe = tmp_path / "test_reversed_probe.py"
    probe.write_text(
        "from sqlalchemy import text\n"
        "from store.engine import make_engine\n\n\n"
        "def test_reversed(pg_url):\n"
        "    e = make_engine(pg_url)\n"
        "    with e.begin() as c:\n"
        "        c.execute(text('SELECT id FROM items WHERE id = 1 FOR UPDATE'))\n"
        "        c.execute(text('SELECT id FROM jobs WHERE id = 1 FOR UPDATE'))\n"
        "    e.dispose()\n\n\n"
        "def test_in_order(pg_url):\n"
        "    e = make_engine(pg_url)\n"
        "    with e.begin() as c:\n"
        "        c.execute(text('SELECT id FROM jobs WHERE id = 1 FOR UPDATE'))\n"
        "        c.execute(text('SELECT id FROM items WHERE id = 1 FOR UPDATE'))\n"
        "    e.dispose()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != lockdep.ENV}
    # When that pytest runs it
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-p", "no:cacheprovider", str(probe)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout + done.stderr
    # Then the reversed test fails at teardown with the violation, and the ordered one passes
    assert done.returncode != 0, out
    assert "2 passed, 1 error" in out, out  # its call passed, its teardown failed it
    assert "ERROR at teardown of test_reversed" in out and "1 lock-order violation(s)" in out, out
    assert "table order: FOR UPDATE on jobs while holding rows of items" in out, out


def _frames(*names: tuple[str, str]) -> list[traceback.FrameSummary]:
    return [traceback.FrameSummary(f"/w/{path}", i, name) for i, (path, name) in enumerate(names, 1)]


def test_only_a_listed_statement_that_cannot_wait_is_excused_its_ascending_id_break() -> None:
    # Given the sweeper's revocation frame (listed in CANNOT_WAIT) and an unlisted store function
    sweeper = _frames(("photojobs/maintenance/services.py", "sweep"), ("store/sweeper.py", "revoke_expired"))
    other = _frames(("store/items.py", "finish"))
    skip = [f"{lockdep.ASCENDING_NO_WAIT}: FOR UPDATE SKIP LOCKED on items id 1 after id 2 of that table"]
    wait = [f"{lockdep.ASCENDING}: FOR UPDATE on items id 1 after id 2 of that table"]
    order = ["table order: FOR UPDATE on jobs while holding rows of items"]
    # When each is looked up, then only the listed function's statement that cannot wait is excused
    assert lockdep._cannot_wait(sweeper, skip) == lockdep.CANNOT_WAIT[("store/sweeper.py", "revoke_expired")]
    assert lockdep._cannot_wait(other, skip) is None
    assert lockdep._cannot_wait(sweeper, wait) is None
    assert lockdep._cannot_wait(sweeper, skip + order) is None
    # And a record fails its test unless it is excused or known
    assert not lockdep.failing({"problems": skip, "known": None, "cannot_wait": "why"})
    assert lockdep.failing({"problems": skip, "known": None, "cannot_wait": None})
    assert lockdep.failing({"problems": wait, "known": None})


def test_skip_locked_and_nowait_statements_are_marked_as_not_waiting(checked: tuple[Engine, str]) -> None:
    # Given a store under the checker
    engine, folder = checked
    _, items, _ = _ids(engine)
    # When a transaction locks the higher item, then the lower one SKIP LOCKED (outside the list)
    with Session(engine) as s, s.begin():
        s.execute(select(Item.id).where(Item.id == items[1]).with_for_update()).all()
        s.execute(select(Item.id).where(Item.id == items[0]).with_for_update(skip_locked=True)).all()
    # Then the break is recorded as one that cannot wait, and still fails its test (not listed)
    (found,) = lockdep.read_violations(folder)
    assert found["problems"] == [
        f"{lockdep.ASCENDING_NO_WAIT}: FOR UPDATE SKIP LOCKED on items id {items[0]}"
        f" after id {items[1]} of that table"
    ]
    assert found["cannot_wait"] is None and lockdep.failing(found)
    nowait = lockdep.classify("SELECT id FROM items WHERE id = %(i)s FOR UPDATE NOWAIT")
    assert [lock.waits for lock in nowait] == [False]


def test_the_sweeper_skips_an_expired_item_another_transaction_holds_instead_of_waiting(
    pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Given an item whose lease expired, its row held by another transaction (a finish in progress)
    import logging
    from dataclasses import replace

    from store import items as store_items
    from store.sweeper import revoke_expired
    from tests.support import wait_for

    engine = make_engine(pg_url)
    spec = replace(all_lanes({})["noop"], lease_ttl=0.05)
    job = store_jobs.submit(engine, [spec], [store_jobs.PhotoInput("/p/a.jpg")]).job_id
    with Session(engine) as s:
        item = s.execute(select(Item.id).where(Item.job_id == job)).scalar_one()
    assert store_items.claim(engine, spec, item, 0, "w").lease is not None
    holder = engine.connect()
    tx = holder.begin()
    holder.execute(select(Item.id).where(Item.id == item).with_for_update()).all()
    try:
        wait_for(lambda: _expired(engine, item), 10, what="the lease to expire")
        # When the sweeper runs (the listed CANNOT_WAIT statement)
        got: list[tuple[int, int]] = []
        sweep = threading.Thread(target=lambda: got.append(revoke_expired(engine, {"noop": spec})))
        with caplog.at_level(logging.WARNING, logger="photojobs.sweeper"):
            sweep.start()
            sweep.join(20)  # a deadline, not a timing: a sweeper that waits for the row never returns
        # (a sweeper that waits for the row gives up at its lock timeout, 1-4 s, and says so)
        waited = sweep.is_alive() or any("past its lock timeout" in r.getMessage() for r in caplog.records)
    finally:
        tx.rollback()
        holder.close()
    sweep.join()
    # Then it skipped the held item instead of waiting for it
    assert not waited and got == [(0, 0)]
    # And revokes it once the holder let go
    assert revoke_expired(engine, {"noop": spec}) == (1, 0)
    engine.dispose()


def _expired(engine: Engine, item: int) -> bool:
    from store.clock import db_now

    with Session(engine) as s:
        return bool(s.execute(select(Item.lease_expires_at < db_now()).where(Item.id == item)).scalar_one())
