"""The sweepers' doorbell (``photojobs.doorbell.ring_sweepers``): a submitted or resumed job is
dispatched at once, not at the next sweep pass. A real sweeper (``photojobs.sweeper_service``) on a
real Redis and either store, with a sweep interval of a minute, so only the ring can explain a
dispatch within seconds."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.config import Settings
from photojobs.doorbell import ring_sweepers
from photojobs.maintenance.service import Service
from photojobs.sweeper_service import Sweeper
from store.models import Item
from tests.support import make_files, wait_for

LONG_INTERVAL = "60"  # seconds between the sweeper's own passes


def _states(client: Client, job_id: int) -> list[str]:
    with Session(client.engine) as s:
        return sorted(s.scalars(select(Item.state).where(Item.job_id == job_id)))


def test_a_submitted_job_is_dispatched_at_once_not_at_the_next_sweep_pass(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given a running sweeper whose next pass is a minute away (its first ran at start), listening
    settings = Settings.from_env({**env, "PHOTOJOBS_SWEEP_INTERVAL": LONG_INTERVAL})
    sweeper = Sweeper(settings)
    sweeper.start()
    client = Client(settings)
    queue = f"dramatiq:{client.specs['noop'].queue}"
    try:
        wait_for(lambda: sweeper.doorbell.listening, 10, what="the sweeper's doorbell to subscribe")
        passes = sweeper.passes
        # When a client submits a job of three files
        make_files(tmp_path / "in", 3)
        job = client.submit(["noop"], [tmp_path / "in"]).job_id
        # Then a pass ran because of the ring, and the job's items are queued with their messages
        # in Redis, long before the sweeper's own next pass
        wait_for(lambda: _states(client, job) == ["queued"] * 3, 10, what="the job's 3 items queued")
        assert sweeper.rung_passes >= 1  # counted before its pass begins
        wait_for(lambda: sweeper.passes > passes, 10, what="the rung pass to be counted")  # after it ends
        assert redis.Redis.from_url(settings.redis_url).llen(queue) == 3
    finally:
        sweeper.stop()
        client.engine.dispose()


def _pause(client: Client, job: int) -> None:
    client.pause(job)


def _fail_every_item(client: Client, job: int) -> None:
    with Session(client.engine) as s, s.begin():
        s.execute(update(Item).where(Item.job_id == job).values(state="failed", error="boom", attempt=3))


@pytest.mark.parametrize(
    ("stop", "stopped", "back_to_work"),
    [(_pause, "paused", Client.resume), (_fail_every_item, "failed", Client.retry)],
    ids=["resumed", "retried"],
)
def test_a_job_put_back_to_work_is_dispatched_at_once(
    env: dict[str, str],
    tmp_path: Path,
    stop: Callable[[Client, int], None],
    stopped: str,
    back_to_work: Callable[[Client, int], int],
) -> None:
    # Given a job of two files, paused (or whose items both failed), and a running sweeper a minute
    # from its next pass
    settings = Settings.from_env({**env, "PHOTOJOBS_SWEEP_INTERVAL": LONG_INTERVAL})
    client = Client(settings)
    make_files(tmp_path / "in", 2)
    job = client.submit(["noop"], [tmp_path / "in"]).job_id  # no sweeper yet: nothing dispatched
    stop(client, job)
    sweeper = Sweeper(settings)
    sweeper.start()
    try:
        wait_for(lambda: sweeper.doorbell.listening, 10, what="the sweeper's doorbell to subscribe")
        assert "queued" not in _states(client, job)  # the first pass passed over it
        assert stopped in _states(client, job)
        # When the client resumes (retries) it
        back_to_work(client, job)
        # Then its items are dispatched now
        wait_for(lambda: _states(client, job) == ["queued"] * 2, 10, what="the job's 2 items queued")
    finally:
        sweeper.stop()
        client.engine.dispose()


def test_submitting_with_redis_unreachable_still_writes_the_job(env: dict[str, str], tmp_path: Path) -> None:
    # Given a client whose Redis refuses connections
    settings = Settings.from_env({**env, "PHOTOJOBS_REDIS_URL": "redis://127.0.0.1:1/0"})
    client = Client(settings)
    make_files(tmp_path / "in", 2)
    try:
        # When it submits a job
        job = client.submit(["noop"], [tmp_path / "in"]).job_id
        # Then the job is written all the same (the sweepers dispatch it at their next pass)
        assert len(_states(client, job)) == 2
        assert ring_sweepers(settings.redis_url) is False
    finally:
        client.engine.dispose()


class _Blocking(Service):
    """A duty that, once armed, holds its pass until released: a pass under way for as long as a
    test wants."""

    name, what = "blocking", "a test duty that blocks"

    def __init__(self) -> None:
        super().__init__()
        self.armed = threading.Event()
        self.started = threading.Event()
        self.release = threading.Event()

    def run_once(self) -> dict[str, int]:
        if self.armed.is_set():
            self.started.set()
            self.release.wait(30)
        return {}


def test_a_ring_during_a_pass_dispatches_without_waiting_for_the_pass(
    env: dict[str, str], tmp_path: Path
) -> None:
    # Given a listening sweeper whose pass is under way and held up by a slow duty (as a pass under
    # a full load is, for tens of milliseconds)
    settings = Settings.from_env({**env, "PHOTOJOBS_SWEEP_INTERVAL": LONG_INTERVAL})
    sweeper = Sweeper(settings)
    blocking = _Blocking()
    sweeper.maintenance.services.insert(0, blocking)
    sweeper.start()
    client = Client(settings)
    held = threading.Thread(target=sweeper._tick, daemon=True)  # what the scheduler runs each interval
    try:
        wait_for(lambda: sweeper.doorbell.listening, 10, what="the sweeper's doorbell to subscribe")
        blocking.armed.set()
        held.start()
        assert blocking.started.wait(10), "the pass did not start"
        # When a client submits a job meanwhile (it rings the sweeper)
        make_files(tmp_path / "in", 3)
        job = client.submit(["noop"], [tmp_path / "in"]).job_id
        # Then the job's items are queued while that pass is still held up
        wait_for(lambda: _states(client, job) == ["queued"] * 3, 10, what="the job's 3 items queued")
        assert sweeper._pass_lock.locked() and not blocking.release.is_set()
    finally:
        blocking.release.set()
        if held.is_alive():
            held.join(30)
        sweeper.stop()
        client.engine.dispose()
