"""Control paths never wait past a lease for a lock (issue 39), on SQLite and PostgreSQL: a cancel or
a pause whose job is held by another transaction (a frozen worker's) answers ``ControlBusy`` —
nothing changed, try again — instead of waiting; the same call goes through once the lock is gone.
The web API answers it 503 ``job_busy`` with ``Retry-After``. The sweeper's revocation behind such
a lock revokes nothing that round (no error) and the next round does."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from store import items as store_items
from store.control import ControlBusy
from store.jobs import PhotoInput, submit
from store.lanes import lane_spec
from store.models import Item, Job
from store.sweeper import revoke_expired
from tests.support import expire_running_leases, make_files


def hold_the_job(engine: Engine, job: int):  # type: ignore[no-untyped-def]
    """A connection holding the job's row as a frozen worker's finish would (SQLite: the write lock)."""
    conn = engine.connect()
    if engine.dialect.name == "sqlite":
        conn.execute(text("SELECT 1"))  # BEGIN IMMEDIATE: the one write lock
    else:
        conn.execute(select(Job.id).where(Job.id == job).with_for_update(read=True))
    return conn


def test_a_cancel_or_pause_of_a_job_held_by_another_transaction_says_busy_and_changes_nothing(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a running job of three photos, with one-second leases
    paths = make_files(tmp_path / "photos", 3)
    job = submit(engine, [lane_spec("noop", env={})], [PhotoInput(str(p)) for p in paths]).job_id
    client = Client(Settings.from_env({"PHOTOJOBS_LEASE_TTL": "1"}), engine=engine, migrate=False)
    # and another transaction holding its row (a worker frozen inside its finish)
    held = hold_the_job(engine, job)
    try:
        # When it is cancelled, and paused
        for action in ("cancel", "pause"):
            with pytest.raises(ControlBusy) as busy:
                client.control(action, job)
            # Then each answers that the job is locked, nothing changed, try again
            assert f"cannot {action} job {job} now: its rows stayed locked" in str(busy.value)
            assert "nothing changed, try again" in str(busy.value)
    finally:
        held.close()
    with Session(engine) as s:
        assert s.get(Job, job).control is None  # type: ignore[union-attr]
        assert {i.state for i in s.execute(select(Item).where(Item.job_id == job)).scalars()} != {"cancelled"}
    # And once the lock is gone the same cancel goes through
    assert client.cancel(job) == 3
    assert client.status(job).state == "cancelled"


def test_a_sweep_behind_a_held_job_revokes_nothing_and_the_next_round_revokes(
    engine: Engine, tmp_path: Path
) -> None:
    # Given a job whose one item's lease has expired (its worker died)
    spec = lane_spec("noop", env={})
    (path,) = make_files(tmp_path / "photos", 1)
    job = submit(engine, [spec], [PhotoInput(str(path))]).job_id
    with Session(engine) as s:
        item = s.execute(select(Item).where(Item.job_id == job)).scalar_one()
    assert store_items.claim(engine, spec, item.id, item.fencing_token, "w1").lease is not None
    expire_running_leases(engine)
    # and another transaction holding the job (PostgreSQL: a cancel's lock; SQLite: the write lock)
    conn = engine.connect()
    if engine.dialect.name == "sqlite":
        conn.execute(text("SELECT 1"))
    else:
        conn.execute(select(Job.id).where(Job.id == job).with_for_update())
    try:
        # When the sweeper runs: its lock wait runs out, and it revokes nothing (no error raised)
        assert revoke_expired(engine, {"noop": spec}) == (0, 0)
    finally:
        conn.close()
    # Then the next round, the lock gone, revokes the lease
    assert revoke_expired(engine, {"noop": spec}) == (1, 0)
    with Session(engine) as s:
        assert s.get(Item, item.id).state == "pending"  # type: ignore[union-attr]
