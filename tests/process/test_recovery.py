"""Issue #2's promises with real ``dramatiq`` worker processes, real Redis, SQLite and PostgreSQL."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.broker import RedisPublisher, build_broker
from photojobs.config import Settings
from store.dispatch import take_for_dispatch
from store.lanes import all_lanes
from store.models import Event, Item
from tests.support import Fleet, event_counts, items_of, job_done, make_files, pid_of_owner, wait_for
from tests.support import events_of as events_of_type


def submit(
    env: dict[str, str], folder: Path, n: int, params: dict[str, str] | None = None, names=None
) -> int:  # type: ignore[no-untyped-def]
    if names:
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_text(name)
    else:
        make_files(folder, n)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [folder], params or {}).job_id
    client.engine.dispose()
    return job


def running_item(engine: Engine, job: int) -> Item | None:
    return next((i for i in items_of(engine, job) if i.state == "running"), None)


def events_of(engine: Engine, item_id: int) -> list[Event]:
    with Session(engine) as s:
        return list(s.execute(select(Event).where(Event.item_id == item_id).order_by(Event.id)).scalars())


def test_sigkilled_worker_item_runs_again_elsewhere_and_completes_once(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given two workers, a sweeper, and an item that takes a while
    job = submit(env, tmp_path / "photos", 1, {"noop.sleep": "3"})
    fleet.start_sweeper()
    fleet.start_worker(threads=1)
    fleet.start_worker(threads=1)
    item = wait_for(lambda: running_item(engine, job), 60, what="the item to be running")
    first_owner = item.lease_owner
    # When the worker process holding it is SIGKILLed mid-item
    os.kill(pid_of_owner(first_owner), signal.SIGKILL)
    # Then the item runs again on another worker and completes, exactly once
    wait_for(lambda: job_done(engine, job), 60, what="the job to finish")
    [done] = items_of(engine, job)
    assert done.state == "succeeded" and done.attempt == 2
    types = [e.type for e in events_of(engine, done.id)]
    assert types.count("item_succeeded") == 1
    assert "lease_expired" in types
    claims = [e for e in events_of(engine, done.id) if e.type == "item_claimed"]
    assert len(claims) == 2 and claims[0].worker == first_owner and claims[1].worker != first_owner


def test_frozen_worker_is_overtaken_and_its_late_commit_rejected(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a worker that freezes (SIGSTOP) just before committing its item's result, and a sweeper
    job = submit(env, tmp_path / "photos", 1)
    fleet.start_sweeper()
    frozen = fleet.start_worker(threads=1, env={"PHOTOJOBS_FAILPOINTS": "noop.before_commit:stop"})
    item = wait_for(lambda: running_item(engine, job), 60, what="the item to be running")
    zombie = item.lease_owner
    wait_for(lambda: Path(f"/proc/{pid_of_owner(zombie)}/stat").read_text().split()[2] == "T", 60)
    # When its lease expires and another worker completes the item
    fleet.start_worker(threads=1)
    wait_for(lambda: job_done(engine, job), 60, what="another worker to finish the item")
    winner = items_of(engine, job)[0]
    # And the frozen worker is resumed (SIGCONT) and tries to commit its result
    os.killpg(frozen.pid, signal.SIGCONT)
    rejected = wait_for(
        lambda: [e for e in events_of(engine, item.id) if e.type == "stale_commit_rejected"],
        60,
        what="the zombie's commit to be rejected",
    )
    # Then its commit is refused, and nothing it wrote is visible: the winner's result stands
    assert rejected[0].worker == zombie and rejected[0].token == item.fencing_token
    final = items_of(engine, job)[0]
    assert final.state == "succeeded" and final.fencing_token == winner.fencing_token
    assert final.result == winner.result and final.result["attempt"] == 2
    assert event_counts(engine, "item_succeeded", job) == {item.id: 1}


def test_same_message_delivered_twice_runs_once(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given two live workers (no sweeper) and one dispatched item
    job = submit(env, tmp_path / "photos", 1, {"noop.sleep": "1"})
    specs = all_lanes(env)
    [publish] = take_for_dispatch(engine, specs["noop"])
    broker = build_broker(env["PHOTOJOBS_REDIS_URL"])
    publisher = RedisPublisher(broker, specs)
    # When its message is delivered twice (two copies in Redis, as after a redelivery)
    publisher.publish([publish])
    from photojobs.broker import lane_message

    copy = lane_message(specs["noop"], publish.item_id, publish.token)
    broker.do_enqueue(specs["noop"].queue, "duplicate-copy", copy.encode())
    fleet.start_worker(threads=2)
    fleet.start_worker(threads=2)
    wait_for(lambda: job_done(engine, job), 60, what="the item to finish")
    # (the other copy processed, not just fetched: its claim turned away for its stale token)
    wait_for(
        lambda: any(
            f"item {publish.item_id} is" in str((e.detail or {}).get("reason"))
            for e in events_of_type(engine, "message_rejected")
        ),
        30,
        what="the second copy to be processed and turned away",
    )
    # Then it ran once: one claim, one success
    assert event_counts(engine, "item_claimed", job) == {publish.item_id: 1}
    assert event_counts(engine, "item_succeeded", job) == {publish.item_id: 1}
    broker.close()


def test_redis_flushall_mid_job_loses_nothing(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path, redis_server
) -> None:  # type: ignore[no-untyped-def]
    # Given a 40-item job in progress, one item per message (so that messages still wait in Redis
    # rather than all sitting in the workers' memory as a few prefetched batches)
    env["PHOTOJOBS_LANE_NOOP_BATCH"] = "1"
    job = submit(env, tmp_path / "photos", 40, {"noop.sleep": "0.5"})
    fleet.start_sweeper()
    fleet.start_worker(threads=2)
    fleet.start_worker(threads=2)
    client = redis_server.client()
    queue = f"dramatiq:{all_lanes(env)['noop'].queue}"
    wait_for(
        lambda: event_counts(engine, "item_succeeded", job) and client.llen(queue) >= 5,
        60,
        what="some items finished and messages waiting in Redis",
    )
    # When Redis loses every message (FLUSHALL), the messages still waiting counted in the same
    # transaction
    with client.pipeline(transaction=True) as pipe:
        waiting, _ = pipe.llen(queue).flushall().execute()
    assert waiting > 0
    # Then every item still completes, none twice
    wait_for(lambda: job_done(engine, job), 90, what="the job to finish after FLUSHALL")
    assert all(i.state == "succeeded" for i in items_of(engine, job))
    counts = event_counts(engine, "item_succeeded", job)
    assert len(counts) == 40 and set(counts.values()) == {1}
    # And the lost messages were published again by the sweeper: at least as many as were waiting
    republished = [
        e
        for e in events_of_type(engine, "item_republished")
        if e.job_id == job and (e.detail or {}).get("reason") == "message not in Redis"
    ]
    assert len({e.item_id for e in republished}) >= waiting


def run_with_a_killer(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path, names: list[str], workers: int
) -> tuple[int, list[Item]]:
    """A noop job over ``names`` whose ``bad`` photo kills its worker, run to the end by a sweeper
    and ``workers`` one-thread workers: (job id, its items)."""
    job = submit(env, tmp_path / "photos", 0, {"noop.crash_if": "bad"}, names=names)
    fleet.start_sweeper()
    for _ in range(workers):
        fleet.start_worker(threads=1)
    wait_for(lambda: job_done(engine, job), 120, what="the job to finish")
    return job, items_of(engine, job)


def test_item_that_kills_its_worker_is_quarantined(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a job whose one photo kills its worker every time, and more workers than attempts
    names = ["ok-1.jpg", "ok-2.jpg", "bad.jpg", "ok-3.jpg"]
    # When the job runs
    job, items = run_with_a_killer(engine, env, fleet, tmp_path, names, workers=4)
    # Then the killer is failed as quarantined after PHOTOJOBS_MAX_ATTEMPTS (3), the others succeed
    bad = [i for i in items if i.state == "failed"]
    assert len(bad) == 1 and bad[0].error == "quarantined: killed its worker 3 times"
    assert sum(i.state == "succeeded" for i in items) == 3
    assert event_counts(engine, "lease_expired", job) == {bad[0].id: 3}


def test_cpu_bound_actor_keeps_its_lease(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a pure-Python CPU-bound item running 3x the lease TTL (2 s), and a sweeper
    job = submit(env, tmp_path / "photos", 1, {"noop.spin": "6"})
    fleet.start_sweeper()
    fleet.start_worker(threads=1)
    # When it runs to the end
    wait_for(lambda: job_done(engine, job), 90, what="the item to finish")
    # Then its lease was never revoked: one attempt, one success, no lease_expired
    [item] = items_of(engine, job)
    assert item.state == "succeeded" and item.attempt == 1
    assert event_counts(engine, "lease_expired", job) == {}


def test_a_photo_that_kills_its_worker_in_a_batch_costs_its_batch_mates_no_attempt(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 48-photo job whose one photo kills its worker every time, two attempts per item, and
    # a lane declared with one thread in a one-process fleet, so that first attempts travel in
    # batch messages of 16 (and a batch of retries would too, if retries were batched)
    env.update(
        {"PHOTOJOBS_MAX_ATTEMPTS": "2", "PHOTOJOBS_FLEET_PROCESSES": "1", "PHOTOJOBS_LANE_NOOP_THREADS": "1"}
    )
    names = [f"ok-{i:02d}.jpg" for i in range(47)] + ["bad.jpg"]
    # When the job runs (on four workers: the killer takes three with it)
    job, items = run_with_a_killer(engine, env, fleet, tmp_path, names, workers=4)
    # Then the killer is quarantined after two deaths charged to it alone and every other photo succeeded
    [bad] = [i for i in items if i.state == "failed"]
    assert bad.error == "quarantined: killed its worker 2 times"
    assert sum(i.state == "succeeded" for i in items) == 47
    # And its first message carried batch-mates, which lost their lease with it once (a death not
    # charged to anyone in the batch: the killer's first death is free too), then ran alone, on
    # their first attempt: none lost an attempt
    expired = event_counts(engine, "lease_expired", job)
    assert expired[bad.id] == 3
    mates = {item: n for item, n in expired.items() if item != bad.id}
    assert mates, "the photo that kills its worker never shared a message: no batch was tested"
    assert set(mates.values()) == {1}
    assert {i.attempt for i in items if i.id in mates} == {1}
