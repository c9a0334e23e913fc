"""Prefetch (twice the threads) with real worker processes, real Redis, SQLite and PostgreSQL: a
killed worker's prefetched messages come back at once through the sweeper, a live worker's stay
with it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import redis
from sqlalchemy import Engine

from photojobs.api import Client
from photojobs.broker import NAMESPACE, RedisPublisher, build_broker
from photojobs.config import Settings
from photojobs.maintenance import sweep_once
from store.dispatch import Publish, stale_queued
from store.lanes import all_lanes
from tests.support import Fleet, event_counts, items_of, job_done, make_files, pid_of_owner, wait_for

QUEUE = "photojobs.noop"


def submit(env: dict[str, str], folder: Path, n: int, params: dict[str, str]) -> int:
    make_files(folder, n)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [folder], params).job_id
    client.engine.dispose()
    return job


def ack_sets(r: redis.Redis) -> dict[str, set[str]]:
    """{worker's Dramatiq broker id: message ids it fetched and has not acknowledged} for the lane."""
    out: dict[str, set[str]] = {}
    for key in r.scan_iter(f"{NAMESPACE}:__acks__.*.{QUEUE}"):
        worker = key.decode()[len(f"{NAMESPACE}:__acks__.") : -len(f".{QUEUE}")]
        out[worker] = {m.decode() for m in r.smembers(key)}
    return out


def prefetched(engine: Engine, job: int, r: redis.Redis, running: int, waiting: int):  # type: ignore[no-untyped-def]
    """(running items, queued items whose message sits in a worker's ack set) once a worker has
    ``running`` items running and ``waiting`` more fetched behind them, else None."""
    items = items_of(engine, job)
    acked = set().union(*ack_sets(r).values())
    run = [i for i in items if i.state == "running"]
    held = [i for i in items if i.state == "queued" and f"pj-{i.id}-{i.fencing_token}" in acked]
    return (run, held) if len(run) == running and len(held) == waiting else None


def test_a_killed_workers_prefetched_items_run_again_at_once_and_once_only(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a sweeper and one worker of 2 threads (prefetch 4) busy on slow items, holding 2 more
    # messages fetched behind them (in its Dramatiq ack set)
    job = submit(env, tmp_path / "photos", 8, {"noop.sleep": "3"})
    r = redis.Redis.from_url(env["PHOTOJOBS_REDIS_URL"])
    fleet.start_sweeper()
    fleet.start_worker(threads=2)
    running, _ = wait_for(
        lambda: prefetched(engine, job, r, running=2, waiting=2), 60, what="2 items running, 2 prefetched"
    )
    # When the worker process holding the leases is SIGKILLed, and another worker starts
    os.kill(pid_of_owner(running[0].lease_owner), signal.SIGKILL)
    [dead_acks] = ack_sets(r).values()
    queued = [i for i in items_of(engine, job) if i.state == "queued"]
    waiting = [i for i in queued if f"pj-{i.id}-{i.fencing_token}" in dead_acks]
    assert waiting, "the killed worker held no prefetched message"
    fleet.start_worker(threads=2)
    # Then every item runs and succeeds exactly once, well before Dramatiq would requeue the dead
    # worker's acks (its heartbeat timeout is 15 s, then a random maintenance pass)
    wait_for(lambda: job_done(engine, job), 40, what="the job to finish")
    items = items_of(engine, job)
    assert all(i.state == "succeeded" for i in items)
    assert event_counts(engine, "item_succeeded", job) == {i.id: 1 for i in items}
    # And the prefetched ones came back through the sweeper (re-published, not revoked: never claimed)
    republished = event_counts(engine, "item_republished", job)
    assert {i.id for i in waiting} <= set(republished)
    claims = event_counts(engine, "item_claimed", job)
    assert all(claims[i.id] == 1 for i in waiting)
    # When Dramatiq requeues the dead worker's old copies after all (as its maintenance would)
    publisher = RedisPublisher(build_broker(env["PHOTOJOBS_REDIS_URL"]), all_lanes(env))
    publisher.publish([Publish(i.id, i.fencing_token, "noop") for i in waiting])
    old = [f"pj-{i.id}-{i.fencing_token}" for i in waiting]
    wait_for(
        lambda: not any(r.hexists(f"{NAMESPACE}:{QUEUE}.msgs", m) for m in old),
        30,
        what="the old copies to be consumed and acknowledged",
    )
    # Then they are turned away by the token: nothing is claimed or run again
    assert event_counts(engine, "item_claimed", job) == claims
    assert event_counts(engine, "item_succeeded", job) == {i.id: 1 for i in items}
    publisher.broker.close()


def test_a_live_workers_prefetched_items_are_never_republished(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given one worker of 2 threads (prefetch 4) on slow items, 2 running and 2 waiting in its ack set
    job = submit(env, tmp_path / "photos", 6, {"noop.sleep": "3"})
    specs = all_lanes(env)
    publisher = RedisPublisher(build_broker(env["PHOTOJOBS_REDIS_URL"]), specs)
    r = publisher.broker.client
    fleet.start_worker(threads=2)

    def sweep_until_prefetched():  # type: ignore[no-untyped-def]
        sweep_once(engine, specs, publisher, republish_after=0.2)
        return prefetched(engine, job, r, running=2, waiting=2)

    _, waiting = wait_for(sweep_until_prefetched, 60, what="2 items running, 2 prefetched")
    # When the sweeper runs again and again while they wait (stale: queued longer than 0.2 s)
    looked_at: set[int] = set()

    def sweep_until_one_is_done() -> bool:
        looked_at.update(p.item_id for p in stale_queued(engine, 0.2))
        report = sweep_once(engine, specs, publisher, republish_after=0.2)
        assert not report.errors, report.errors
        return bool(event_counts(engine, "item_succeeded", job))

    wait_for(sweep_until_one_is_done, 60, what="the first item to finish")
    # Then the sweeper looked at the prefetched items and re-published none of them
    assert {i.id for i in waiting} <= looked_at
    assert event_counts(engine, "item_republished", job) == {}

    # And the job finishes with every item run once
    def sweep_until_done() -> bool:
        sweep_once(engine, specs, publisher, republish_after=0.2)
        return job_done(engine, job)

    wait_for(sweep_until_done, 60, what="the job to finish")
    assert event_counts(engine, "item_succeeded", job) == {i.id: 1 for i in items_of(engine, job)}
    assert event_counts(engine, "item_republished", job) == {}
    publisher.broker.close()
