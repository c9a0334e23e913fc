"""Bad messages in Redis: each rejected with its reason, none runs, the job is unharmed."""

from __future__ import annotations

import json
from pathlib import Path

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from photojobs.api import Client
from photojobs.broker import build_broker, lane_message
from photojobs.config import Settings
from store.lanes import all_lanes
from store.models import Event
from tests.support import Fleet, event_counts, items_of, job_done, make_files, wait_for


def rejections(engine: Engine) -> list[str]:
    with Session(engine) as s:
        rows = s.execute(select(Event.detail).where(Event.type == "message_rejected")).scalars().all()
    return [r["reason"] for r in rows]


def test_bad_messages_are_rejected_and_the_job_finishes(
    engine: Engine, env: dict[str, str], fleet: Fleet, tmp_path: Path
) -> None:
    # Given a 5-item job and one worker (no sweeper, so only our messages are in Redis)
    make_files(tmp_path / "photos", 5)
    client = Client(Settings.from_env(env))
    job = client.submit(["noop"], [tmp_path / "photos"]).job_id
    items = items_of(engine, job)
    spec = all_lanes(env)["noop"]
    broker = build_broker(env["PHOTOJOBS_REDIS_URL"])
    # When malformed JSON, a message for another lane, for an unknown item, with a wrong token,
    # and for a foreign actor are put in the lane's queue
    broker.do_enqueue(spec.queue, "bad-json", b"{not json at all")
    exif_msg = lane_message(all_lanes(env)["exif"], items[0].id, 0)
    broker.do_enqueue(spec.queue, "wrong-lane", exif_msg.encode())
    broker.do_enqueue(spec.queue, "unknown-item", lane_message(spec, 987654, 0).encode())
    broker.do_enqueue(spec.queue, "wrong-token", lane_message(spec, items[1].id, 7).encode())
    foreign = json.loads(lane_message(spec, items[2].id, 0).encode())
    foreign["actor_name"] = "evil_actor"
    broker.do_enqueue(spec.queue, "foreign", json.dumps(foreign).encode())
    fleet.start_worker(threads=2)
    reasons = wait_for(lambda: len(rejections(engine)) >= 5 and rejections(engine), 60, what="5 rejections")
    # Then each was rejected with its own reason and none claimed an item
    joined = " | ".join(reasons)
    assert "malformed message" in joined
    assert "belongs to lane 'noop', not 'exif'" in joined  # an exif message on the noop queue
    assert "unknown item 987654" in joined
    assert "stale token 7" in joined
    assert "evil_actor" in joined
    assert event_counts(engine, "item_claimed", job) == {}
    # And the job itself runs to the end, each item once, with the same worker still alive
    fleet.start_sweeper()
    wait_for(lambda: job_done(engine, job), 60, what="the job to finish")
    assert {i.state for i in items_of(engine, job)} == {"succeeded"}
    assert set(event_counts(engine, "item_succeeded", job).values()) == {1}
    assert fleet.procs[0].poll() is None
    broker.close()
    client.engine.dispose()
